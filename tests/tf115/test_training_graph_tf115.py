"""A graph saved from a loss-scaled training session trains on in TensorFlow 1.15's runtime.

TensorFlow 1.15 has never loaded tfamp_rewrite's op library here, as on a serving machine or
a float32 process: the graph must hold stock ops only (tfamp_rewrite/fused_op/fusable.py).
It is built as TF1 programs build it (reference variables, Switch/Merge control flow),
trained two steps in a rewriting session, saved with its Saver, then restored and trained
in 1.15: a finite step applies, an inf step is skipped and halves the loss scale.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from graph_runner import plain_config
from model_graphs import control_flow_v1
from tf115_graphs import op_attrs, written_by_tf115

import tfamp_rewrite
from tfamp_rewrite import LossScaleOptimizer

tf1 = tf.compat.v1
STATE = ["state/global_step:0", "state/w:0", "state/loss_scale:0"]  # values, whatever the variables' kind


@pytest.fixture
def saved_training(tmp_path, monkeypatch):
    """``(graph_def, saver_def, checkpoint prefix)`` after two steps in a rewriting session."""
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf1.placeholder(tf.float32, [2, 3], name="x")
        w = tf1.get_variable("w", initializer=np.arange(6, dtype=np.float32).reshape(2, 3) / 6,
                             use_resource=False)
        loss = tf.reduce_sum(tf.square(x * w - 1.0))
        step = tf1.train.get_or_create_global_step()
        LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01)).minimize(loss, step, name="train")
        (scale,) = [v for v in tf1.global_variables() if v.op.name == "loss_scale/current_loss_scale"]
        with tf.name_scope("state"):
            for name, variable in (("global_step", step), ("w", w), ("loss_scale", scale)):
                tf.identity(variable, name=name)
        init = tf1.global_variables_initializer()
        saver = tf1.train.Saver()
    with tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(2):
            session.run("train", {x: np.ones((2, 3), np.float32)})
        prefix = saver.save(session, str(tmp_path / "model"))
    return graph.as_graph_def(), saver.as_saver_def(), prefix


def test_a_loss_scaled_training_graph_trains_on_in_tf115(saved_training, tf115, verified):
    graph_def, saver, prefix = saved_training
    assert "UnscaleAndCheckFinite" not in {node.op for node in graph_def.node}
    written = written_by_tf115(graph_def, tf115, op_attrs(tf115.all_op_list()))  # 1.15 imports it
    ones, infs = np.ones((2, 3), np.float32), np.full((2, 3), np.inf, np.float32)
    steps = [({saver.filename_tensor_name: prefix.encode()}, [], [saver.restore_op_name]),
             ({}, STATE, []),
             ({"x:0": ones}, [], ["train"]), ({}, STATE, []),
             ({"x:0": infs}, [], ["train"]), ({}, STATE, [])]
    restored, applied, skipped = tf115.run_steps(written.SerializeToString(), steps,
                                                 plain_config().SerializeToString())[1::2]
    assert restored[0] == 2 and applied[0] == 3 and skipped[0] == 3
    assert not np.array_equal(applied[1], restored[1])
    np.testing.assert_array_equal(skipped[1], applied[1])
    assert skipped[2] == applied[2] / 2
    verified("graphs saved from training", "a TF1 graph trained 2 steps with LossScaleOptimizer in a "
             "rewriting session, saved by its Saver: imports into TF 1.15 without the op library, "
             "restores, applies a finite step, skips an inf step (loss scale %g -> %g)"
             % (applied[2], skipped[2]))

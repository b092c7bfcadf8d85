"""A graph saved from a loss-scaled program loads where tfamp_rewrite is not installed.

TF1 programs save their graph with every checkpoint (``Saver``'s ``.meta``), and serve or
fine-tune from it elsewhere: TF Serving, a float32 process, a machine without this package.
The loss-scale optimizer's graph holds stock ops only; the sessions that rewrite run the
fused op in their copy of it (tfamp_rewrite/fused_op/fusable.py).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from repo_paths import REPO, SCRIPTS

import tfamp_rewrite
from tfamp_rewrite import LossScaleOptimizer
from tfamp_rewrite.fused_op.op import OP_TYPE

tf1 = tf.compat.v1


def run_script(name, *args, amp):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_ENABLE_AUTO_MIXED", "TFAMP_"))}
    env.update(TFAMP_REWRITE_TARGET="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    if amp:
        env["TF_ENABLE_AUTO_MIXED_PRECISION"] = "1"
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, name), *map(str, args)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.own_processes("unmodified TF1 programs in new processes")
def test_a_zero_code_amp_checkpoints_meta_graph_trains_on_in_a_process_without_the_op(tmp_path):
    trained = run_script("resume_training.py", tmp_path, 4, amp=True)
    assert trained["finished_at"] == 4 and trained["loss_scale"] == 2.0 ** 15
    saved_scale = tf1.train.load_variable(str(tmp_path), "loss_scale/current_loss_scale")
    resumed = run_script("train_from_meta_graph.py", tmp_path, 3, amp=False)
    assert resumed["op_registered"] is False
    assert resumed["steps"] == [4, 7]
    assert resumed["loss_scales"][0] == saved_scale and np.isfinite(resumed["loss_scales"][1])


def test_the_session_fuses_what_the_user_graph_holds_as_stock_ops(monkeypatch):
    """Same steps, same values: the user graph runs its stock ops in a plain session, the
    rewriting session runs the fused op (target cpu; no op of this graph is one the rewrite
    makes half, so both compute in float32); an injected inf skips the step in both."""
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 3], name="x")
        w = tf1.get_variable("w", initializer=np.arange(6, dtype=np.float32).reshape(2, 3) / 6)
        loss = tf.reduce_sum(tf.square(x * w - 1.0))
        train = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01), "dynamic").minimize(loss)
        init = tf1.global_variables_initializer()
    feeds = [np.ones((2, 3), np.float32), np.full((2, 3), np.inf, np.float32), np.ones((2, 3), np.float32)]

    def weights_after_each_step(session):
        session.run(init)
        weights = []
        for value in feeds:
            session.run(train, {x: value})
            weights.append(session.run(w))
        return weights

    assert OP_TYPE not in {op.type for op in graph.get_operations()}
    with tf1.Session(graph=graph) as plain:
        stock = weights_after_each_step(plain)
    with tfamp_rewrite.Session(graph=graph) as rewriting:
        fused = weights_after_each_step(rewriting)
        assert [op.type for op in rewriting._shadow.graph.get_operations()].count(OP_TYPE) == 1
    np.testing.assert_array_equal(stock[1], stock[0])  # the inf step was skipped
    assert not np.array_equal(stock[2], stock[1])
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)

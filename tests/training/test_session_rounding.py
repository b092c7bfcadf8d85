"""Emulated sessions round with the RoundToHalf op where it loads, with Cast pairs where not.

Either way a session computes the same bits: losses, fetched rounded outputs of emulated
nodes and weights after training steps, in nodes added to the graph later too.
"""
import logging

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import conv_net, transformer_block

from tfamp_rewrite.fused_op import op as fused_op
from tfamp_rewrite.fused_op import round_to_half as rounding
from tfamp_rewrite.graph_rewrite.rounding import ROUND_OP_TYPE
from tfamp_rewrite.training.session import Session

tf1 = tf.compat.v1
STEPS = 3


@pytest.fixture(autouse=True)
def emulated_cpu_sessions(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")


def use_library(monkeypatch, enabled):
    """A fresh choice of rounding, as a process with (or without) the library makes it."""
    if enabled:
        monkeypatch.delenv(fused_op.DISABLE_ENV, raising=False)
    else:
        monkeypatch.setenv(fused_op.DISABLE_ENV, "1")
    monkeypatch.setattr(fused_op, "_LOADER", fused_op._OpLoader())
    monkeypatch.setattr(rounding, "_CHOICE", rounding._RoundingChoice())
    assert rounding.round_to_half_available() is enabled


def train(model):
    """Loss and fetched half outputs per step, a node added after the first run, final weights;
    and how many RoundToHalf nodes the session ran (its report's count of pairs replaced)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(model.graph_def, name="")
    names = {op.name for op in graph.get_operations()}
    weights = [name + ":0" for name in sorted(names) if name.endswith("/Read/ReadVariableOp")]
    feeds = model.feed_values(np.random.default_rng(0))
    matmuls = [op.outputs[0] for op in graph.get_operations() if op.type in ("MatMul", "Conv2D")]
    history = []
    with Session(graph=graph) as session:
        session.run(model.init)
        for step in range(STEPS):
            history.append(session.run(["loss:0", "train_op"] + matmuls, feeds))
            if step == 0:
                with graph.as_default():
                    later = tf.matmul(matmuls[-1], matmuls[-1], transpose_a=True, name="added_later")
                matmuls.append(later)
        final = session.run(weights)
        nodes = [op for op in session._shadow.graph.get_operations() if op.type == ROUND_OP_TYPE]
        replaced = session.rewrite_reports[-1].emulation.rounding_ops  # each sync rewrites it all
    return history, final, len(nodes), replaced


def same_bits(first, second):
    first, second = np.asarray(first), np.asarray(second)
    return first.dtype == second.dtype and first.shape == second.shape and first.tobytes() == second.tobytes()


@pytest.mark.parametrize("build", [conv_net, transformer_block], ids=["conv_net", "transformer"])
def test_sessions_compute_the_same_bits_with_the_op_and_with_casts(monkeypatch, build):
    model = build()
    use_library(monkeypatch, True)
    with_op, weights_op, nodes, replaced = train(model)
    use_library(monkeypatch, False)
    with_casts, weights_casts, no_nodes, none_replaced = train(model)
    assert nodes == replaced > 0 and no_nodes == none_replaced == 0
    for step, (a, b) in enumerate(zip(with_op, with_casts)):
        assert all(same_bits(x, y) for x, y in zip(a, b) if x is not None), "step %d" % step
    assert all(same_bits(x, y) for x, y in zip(weights_op, weights_casts))
    half = with_op[-1][2]  # a fetched MatMul/Conv output: rounded to half, as a GPU returns it
    assert np.array_equal(half, half.astype(np.float16).astype(np.float32))


def test_the_choice_is_logged_once(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger=fused_op.__name__):
        use_library(monkeypatch, False)
        train(conv_net())
        train(conv_net())
    (record,) = [r for r in caplog.records if "emulated rounding" in r.getMessage()]
    assert "Cast pairs" in record.getMessage() and fused_op.DISABLE_ENV in record.getMessage()

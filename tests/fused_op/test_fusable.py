"""Stock-op unscale groups and their fusion into UnscaleAndCheckFinite (fused_op/fusable.py).

A graph holding the groups loads in any TensorFlow; ``fuse_unscale_groups`` turns its
GraphDef into one that runs the fused op, with the same values bit for bit, the same names,
and every gradient read by the op alone.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from fused_op_cases import assert_matches_oracle, poison, random_gradients, random_sizes

import tfamp_rewrite
from tfamp_rewrite.fused_op.fusable import MARKER_ATTR, OP_TYPE, fuse_unscale_groups

tf1 = tf.compat.v1
INV_SCALE = 2.0 ** -7


@pytest.fixture(autouse=True)
def op_loaded():
    assert tfamp_rewrite.fused_op_available(), "the fused op must build and load (make op)"


def stock_graph(arrays, devices=("",)):
    """Placeholders ``g<i>`` (on ``devices`` in turn) unscaled by one portable call; returns
    the graph and the names of the unscaled tensors and the flag."""
    graph = tf.Graph()
    with graph.as_default():
        grads = []
        for i, a in enumerate(arrays):
            with tf.device(devices[i % len(devices)]):
                grads.append(tf1.placeholder(a.dtype, a.shape, name="g%d" % i))
        unscaled, all_finite = tfamp_rewrite.unscale_and_check_finite(grads, INV_SCALE, portable=True)
    return graph, [t.name for t in unscaled] + [all_finite.name]


def run_graph_def(graph_def, arrays, fetches, prefix=""):
    """``(unscaled, all_finite, graph)`` of ``graph_def``, whose names start with ``prefix``."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    feeds = {"%sg%d:0" % (prefix, i): a for i, a in enumerate(arrays)}
    with tf1.Session(graph=graph) as session:
        values = session.run([prefix + name for name in fetches], feeds)
    return values[:-1], bool(values[-1]), graph


@pytest.mark.parametrize("poisoned", [False, True], ids=["finite", "inf-nan"])
def test_fused_and_stock_groups_compute_the_same_bits(poisoned):
    rng = np.random.default_rng(3)
    arrays = random_gradients(rng, random_sizes(rng, 24))
    if poisoned:
        arrays = poison(rng, arrays)
    graph, fetches = stock_graph(arrays)
    stock = run_graph_def(graph.as_graph_def(), arrays, fetches)
    fused_def = graph.as_graph_def()
    scopes, left = fuse_unscale_groups(fused_def)
    assert len(scopes) == 1 and not left
    fused = run_graph_def(fused_def, arrays, fetches)
    assert_matches_oracle(stock[0], stock[1], arrays, INV_SCALE)
    assert_matches_oracle(fused[0], fused[1], arrays, INV_SCALE)
    for a, b in zip(stock[0], fused[0]):
        assert a.tobytes() == b.tobytes()
    ops = fused[2].get_operations()
    (op,) = [op for op in ops if op.type == OP_TYPE]
    assert not [o for o in ops if o.type in ("IsFinite", "Mul", "Pack")]
    assert all([c.name for c in t.consumers()] == [op.name] for t in op.inputs[:-1])


def test_one_fused_op_per_device_of_the_gradients():
    arrays = [np.ones(5, np.float16), np.ones(3, np.float32), np.ones(2, np.float32)]
    graph, fetches = stock_graph(arrays, devices=("/cpu:0", "/cpu:1"))
    graph_def = graph.as_graph_def()
    scopes, _ = fuse_unscale_groups(graph_def)
    fused = [node for node in graph_def.node if node.op == OP_TYPE]
    assert len(scopes) == 2
    assert sorted(node.device for node in fused) == ["/device:CPU:0", "/device:CPU:1"]
    assert sorted(len(node.input) - 1 for node in fused) == [1, 2]


def test_a_graph_imported_under_a_prefix_fuses():
    arrays = [np.full(4, 3.0, np.float16)]
    graph, fetches = stock_graph(arrays)
    prefixed = tf.Graph()
    with prefixed.as_default():
        tf1.import_graph_def(graph.as_graph_def(), name="model")
    graph_def = prefixed.as_graph_def()
    scopes, left = fuse_unscale_groups(graph_def)
    assert [s.split("/")[0] for s in scopes] == ["model"] and not left
    unscaled, all_finite, _ = run_graph_def(graph_def, arrays, fetches, prefix="model/")
    assert all_finite and unscaled[0].tolist() == [3.0 * INV_SCALE] * 4


@pytest.mark.parametrize("reader", ["an op", "a TF1 cond's Switch"])
def test_a_group_read_from_outside_stays_stock_ops_and_says_why(reader):
    arrays = [np.ones(3, np.float32)]
    graph, fetches = stock_graph(arrays)
    with graph.as_default():
        (checked,) = [op for op in graph.get_operations() if op.type == "IsFinite"]
        if reader == "an op":
            tf.logical_not(checked.outputs[0], name="user_reads_the_check")
        else:  # apply_gradients inside the program's tf.cond: its Switch reads the values
            tf.raw_ops.Switch(data=checked.outputs[0], pred=tf.constant(True), name="user_reads_the_check")
    graph_def = graph.as_graph_def()
    before = graph_def.SerializeToString(deterministic=True)
    scopes, left = fuse_unscale_groups(graph_def)
    said = "'user_reads_the_check' reads the check's value '%s'" % checked.name
    if reader != "an op":
        said = "apply_gradients was called inside TF1 control flow (a tf.cond or while loop of the " \
               "program's), whose " + said
    assert scopes == [] and list(left.values()) == [said]
    assert graph_def.SerializeToString(deterministic=True) == before


def test_control_inputs_from_outside_the_group_move_onto_the_fused_op():
    graph = tf.Graph()
    with graph.as_default():
        grad = tf1.placeholder(tf.float32, [3], name="g0")
        first = tf.no_op(name="first")
        with tf.control_dependencies([first]):
            tfamp_rewrite.unscale_and_check_finite([grad], INV_SCALE, portable=True)
    graph_def = graph.as_graph_def()
    fuse_unscale_groups(graph_def)
    (fused,) = [node for node in graph_def.node if node.op == OP_TYPE]
    assert "^first" in fused.input


def test_a_graph_without_groups_is_left_alone():
    graph = tf.Graph()
    with graph.as_default():
        tf.math.is_finite(tf1.placeholder(tf.float32, [2]) * 2.0)
    graph_def = graph.as_graph_def()
    before = graph_def.SerializeToString(deterministic=True)
    assert fuse_unscale_groups(graph_def) == ([], {})
    assert graph_def.SerializeToString(deterministic=True) == before
    assert not any(MARKER_ATTR in node.attr for node in graph_def.node)

"""compat="tf1.15" writes what TensorFlow 1.15 reads: no default-valued attributes.

TF 2.x writes attributes 1.15 does not know into every node (FusedBatchNormV3's
``exponential_avg_factor``, MaxPool's ``explicit_paddings``), always with their default
value; 1.15 rejects them but fills in missing defaults. tests/tf115 runs the results in
TensorFlow 1.15 itself; these tests check the same contract within TensorFlow 2.x.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from graph_runner import copy_of, run_graph
from model_graphs import conv_net

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.graph_rewrite.rewrite import op_def_lookup

tf1 = tf.compat.v1
TF2_ONLY_DEFAULTS = {("FusedBatchNormV3", "exponential_avg_factor"), ("MaxPool", "explicit_paddings")}


def default_valued(graph_def):
    """``(op, attr)`` of every attribute of ``graph_def`` whose value is its op's default."""
    lookup = op_def_lookup(graph_def)
    found = set()
    for node in graph_def.node:
        op_def = lookup(node.op)
        for attr in op_def.attr if op_def else ():
            if attr.HasField("default_value") and attr.name in node.attr \
                    and node.attr[attr.name] == attr.default_value:
                found.add((node.op, attr.name))
    return found


def refilled(graph_def):
    """``graph_def`` imported by this TensorFlow and exported again (defaults filled in)."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(copy_of(graph_def), name="")
    return graph.as_graph_def()


def test_tf115_output_leaves_out_default_valued_attributes_latest_keeps_them():
    model = conv_net()
    assert TF2_ONLY_DEFAULTS <= default_valued(model.graph_def)  # what 1.15 would reject
    kwargs = dict(fetches=model.fetches, feeds=model.feeds, target="cpu")
    latest = rewrite_graph_def(model.graph_def, **kwargs)
    tf115 = rewrite_graph_def(model.graph_def, compat="tf1.15", **kwargs)
    assert TF2_ONLY_DEFAULTS <= default_valued(latest.graph_def)
    assert default_valued(tf115.graph_def) == set()
    assert any("default-valued attribute(s) left out" in note for note in tf115.report.notes)
    batch_norms = [n for n in tf115.graph_def.node if n.op == "FusedBatchNormV3"]
    assert batch_norms and all(n.attr["epsilon"].f == np.float32(1e-3) for n in batch_norms)  # not 1e-4


def test_tf115_output_means_the_same_once_defaults_are_filled_in():
    model = conv_net()
    result = rewrite_graph_def(model.graph_def, fetches=model.fetches, feeds=model.feeds,
                               target="cpu", compat="tf1.15")
    feeds = model.feed_values(np.random.default_rng(0))
    fetches = ["loss:0"]
    stripped = run_graph(result.graph_def, fetches, feeds, init=model.init, train_op=model.fetches[0],
                         steps=2)
    filled = run_graph(refilled(result.graph_def), fetches, feeds, init=model.init,
                       train_op=model.fetches[0], steps=2)
    np.testing.assert_array_equal(stripped, filled)
    again = rewrite_graph_def(result.graph_def, fetches=model.fetches, feeds=model.feeds,
                              target="cpu", compat="tf1.15")
    assert again.report.nodes_converted == 0 and again.graph_def == result.graph_def


def test_tf115_output_leaves_out_resource_variables_debug_names():
    """TF 2.x names a resource variable in ``debug_name``, an attribute 1.15's VarHandleOp lacks."""
    graph = tf.Graph()
    with graph.as_default():
        weights = tf1.get_variable("w", [4, 2], use_resource=True)
        tf.matmul(tf1.placeholder(tf.float32, [1, 4], name="x"), weights.read_value(), name="y")
    graph_def = graph.as_graph_def()
    (handle,) = [node for node in graph_def.node if node.op == "VarHandleOp"]
    debug_name = handle.attr["debug_name"].s
    assert debug_name.startswith(b"w")  # b"w/" in TF 2.15
    kwargs = dict(fetches=["y"], feeds=["x"], target="cpu")
    latest = rewrite_graph_def(graph_def, **kwargs)
    tf115 = rewrite_graph_def(graph_def, compat="tf1.15", **kwargs)
    assert [n.attr["debug_name"].s for n in latest.graph_def.node if n.op == "VarHandleOp"] == [debug_name]
    (handle,) = [node for node in tf115.graph_def.node if node.op == "VarHandleOp"]
    assert "debug_name" not in handle.attr and handle.attr["shared_name"].s == b"w"
    assert any("1 resource variable debug_name attribute(s) left out" in note for note in tf115.report.notes)

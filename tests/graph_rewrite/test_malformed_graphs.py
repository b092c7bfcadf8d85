"""Malformed graphs raise GraphRewriteError naming the node; unknown ops are boundaries."""
import numpy as np
import pytest
import tensorflow as tf
from graph_runner import run_graph
from tensorflow.core.framework import graph_pb2

from tfamp_rewrite import GraphRewriteError, rewrite_graph_def

tf1 = tf.compat.v1


def small_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 2], name="x")
        m = tf.matmul(x, x, name="mm")
        tf.identity(tf.nn.relu(m, name="relu"), name="out")
    return graph.as_graph_def()


def _node(graph_def, name):
    return next(n for n in graph_def.node if n.name == name)


@pytest.mark.parametrize("break_graph,node,words", [
    ("dangling_input", "relu", "dangling"),
    ("duplicate_name", "relu", "duplicate"),
    ("cycle", "mm", "cycle"),
    ("missing_output_port", "relu", "output"),
    ("wrong_input_count", "mm", "expects 2"),
])
def test_malformed_graph_names_the_node(break_graph, node, words):
    graph_def = small_graph()
    if break_graph == "dangling_input":
        _node(graph_def, "relu").input[0] = "ghost"
    elif break_graph == "duplicate_name":
        graph_def.node.add().CopyFrom(_node(graph_def, "relu"))
    elif break_graph == "cycle":
        _node(graph_def, "mm").input[1] = "relu"
    elif break_graph == "missing_output_port":
        _node(graph_def, "relu").input[0] = "mm:3"
    elif break_graph == "wrong_input_count":
        del _node(graph_def, "mm").input[1]
    with pytest.raises(GraphRewriteError) as error:
        rewrite_graph_def(graph_def, fetches=["out"])
    assert error.value.node in (node, "mm", "relu")
    assert words in str(error.value)
    assert "%r" % error.value.node in str(error.value)


def test_cycles_through_next_iteration_are_while_loops_not_errors():
    from model_graphs import while_loop

    result = rewrite_graph_def(while_loop().graph_def, fetches=["output"], target="cpu")
    assert result.report.nodes_converted > 0


def test_unknown_op_is_a_float32_boundary_and_reported():
    graph_def = small_graph()
    mystery = graph_def.node.add(name="mystery", op="NotARealOp")
    mystery.input.append("mm")
    mystery.attr["T"].type = tf.float32.as_datatype_enum
    _node(graph_def, "relu").input[0] = "mystery"
    after = graph_def.node.add(name="mm2", op="MatMul")
    after.input.extend(["mystery", "mystery"])
    after.attr["T"].type = tf.float32.as_datatype_enum
    fetch = graph_def.node.add(name="out2", op="Identity", input=["mm2"])
    fetch.attr["T"].type = tf.float32.as_datatype_enum
    result = rewrite_graph_def(graph_def, fetches=["out", "out2"], target="cpu")
    decision = result.report.decision("mystery")
    assert decision.rule == "unknown_op" and "float32 boundary" in decision.reason
    assert any("NotARealOp" in note for note in result.report.notes)
    nodes = {n.name: n for n in result.graph_def.node}
    # mm is half, so its output is cast back to float32 before the unknown op...
    assert nodes["mystery"].input[0].endswith("CastToFp32-0-AutoMixedPrecision")
    # ...and the unknown op's float32 output is cast to half for the MatMul after it.
    assert nodes["mm2"].input[0] == nodes["mm2"].input[1]
    assert "mystery-0-CastToFp16" in nodes["mm2"].input[0]


def test_empty_graph_is_fine():
    result = rewrite_graph_def(graph_pb2.GraphDef())
    assert result.report.nodes_total == 0 and not result.graph_def.node


def test_graph_without_allow_ops_is_unchanged_and_says_why():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2], name="x")
        tf.identity(tf.nn.relu(x), name="out")
    graph_def = graph.as_graph_def()
    result = rewrite_graph_def(graph_def, fetches=["out"], target="cpu")
    assert result.graph_def == graph_def
    assert any("nothing to convert" in note for note in result.report.notes)
    assert run_graph(result.graph_def, "out:0", {"x:0": np.ones(2, np.float32)}).dtype == np.float32


def test_a_float64_model_is_left_as_it_is_and_its_line_says_why():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [2, 4], name="x")
        w = tf.constant(np.ones((4, 3)), tf.float64)
        tf.identity(tf.matmul(tf.matmul(x, w), tf.transpose(w)), name="out")
    graph_def = graph.as_graph_def()
    report = rewrite_graph_def(graph_def, fetches=["out"], target="cpu").report
    assert report.nodes_converted == 0
    assert "2 allow-list node(s) compute in float64" in report.one_line()
    assert "nothing to convert" in report.one_line()


def test_a_line_that_converts_says_nothing_of_nothing_to_convert():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        tf.identity(tf.matmul(x, tf.ones([4, 3])), name="out")
    report = rewrite_graph_def(graph.as_graph_def(), fetches=["out"], target="cpu").report
    assert report.nodes_converted > 0 and report.nothing_converted_because is None

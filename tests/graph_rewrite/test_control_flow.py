"""Which nodes run inside TF1 control flow, found from the graph alone, against TensorFlow's
own record: the graph a Python program builds marks what it put in a cond branch or while
loop as not fetchable (``Graph.is_fetchable``), which an imported GraphDef no longer knows.
Two differences are by design: a loop's ``Enter`` (and a ``ControlTrigger`` in a gradient
loop), which TensorFlow leaves fetchable, counts as inside its loop; and a cond's
``pred_id``, which TensorFlow marks, is outside: it reads only what is outside the cond."""
import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1

from tfamp_rewrite.graph_rewrite.control_flow import (
    IN_BRANCH,
    IN_LOOP,
    control_flow_of,
    graph_def_inputs,
    tf_graph_inputs,
)

tf1 = tf.compat.v1


def _nested_conds():
    x = tf1.placeholder(tf.float32, [4], name="x")
    p = tf1.placeholder(tf.bool, [], name="p")
    q = tf1.placeholder(tf.bool, [], name="q")

    def outer_true():
        inner = tf1.cond(q, lambda: x * 2.0, lambda: x - 1.0)
        return tf.exp(inner, name="after_inner_merge")  # still in the outer branch

    out = tf1.cond(p, outer_true, lambda: tf.identity(x))
    return tf.reduce_sum(out * x, name="outside")


def _cond_in_loop_and_loop_in_cond():
    x = tf1.placeholder(tf.float32, [4], name="x")
    p = tf1.placeholder(tf.bool, [], name="p")

    def body(i, acc):
        step = tf1.cond(acc[0] > 10.0, lambda: acc * 0.5, lambda: acc + x)
        return i + 1, tf.sqrt(tf.abs(step) + 1.0, name="after_cond_in_loop")

    looped = tf1.while_loop(lambda i, _: i < 3, body, [0, x])[1]

    def with_loop():
        inner = tf1.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a * 2.0), [0, x])[1]
        return tf.tanh(inner, name="after_loop_in_branch")

    return tf.add(tf1.cond(p, with_loop, lambda: x), looped, name="outside")


def _trained(build):
    """``build()``'s loss, minimized: TF1's cond_grad and while-loop gradients add Merges,
    Switches, stacks and loops of their own."""
    loss = build()
    w = tf1.get_variable("w", initializer=tf.ones([4]))
    total = tf.reduce_sum(loss * w)
    tf1.train.GradientDescentOptimizer(0.1).minimize(total + tf.reduce_sum(tf.square(w)))


def _lstm():
    inputs = tf1.placeholder(tf.float32, [2, 5, 3])
    cell = tf1.nn.rnn_cell.LSTMCell(4)
    outputs, _ = tf1.nn.dynamic_rnn(cell, inputs, dtype=tf.float32)
    return tf.reduce_mean(outputs[:, -1], axis=0)


def _step_inside_cond():
    x = tf1.placeholder(tf.float32, [4], name="x")
    w = tf1.get_variable("v", initializer=tf.ones([4]))
    apply_now = tf1.placeholder(tf.bool, [])
    optimizer = tf1.train.GradientDescentOptimizer(0.1)
    tf1.cond(apply_now, lambda: optimizer.minimize(tf.reduce_sum(tf.square(x * w))), tf.no_op)
    return x


GRAPHS = {
    "nested conds": _nested_conds,
    "cond in loop, loop in cond": _cond_in_loop_and_loop_in_cond,
    "nested conds, trained": lambda: _trained(_nested_conds),
    "cond in loop, loop in cond, trained": lambda: _trained(_cond_in_loop_and_loop_in_cond),
    "dynamic_rnn LSTM, trained": lambda: _trained(_lstm),
    "minimize inside a cond": _step_inside_cond,
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_nodes_inside_control_flow_are_what_tensorflow_marks_unfetchable(name):
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        GRAPHS[name]()
    operations = graph.get_operations()
    expected = {op.name for op in operations if not graph.is_fetchable(op) and not _pred_id(op)}
    expected |= {op.name for op in operations if op.type in ("Enter", "ControlTrigger")
                 and op._get_control_flow_context() is not None}
    assert expected, "the graph holds no TF1 control flow"
    from_graph = control_flow_of(*tf_graph_inputs(operations))
    assert {operations[i].name for i in from_graph} == expected
    graph_def = graph.as_graph_def()
    from_graph_def = control_flow_of(*graph_def_inputs(graph_def))
    assert {graph_def.node[i].name for i in from_graph_def} == expected


def _pred_id(op) -> bool:
    """An outermost cond's copy of its predicate: TensorFlow marks it, though it reads only
    what is outside the cond and is computed whichever branch runs."""
    return op.name.endswith("pred_id") and op._get_control_flow_context() is None


def test_a_loop_is_told_from_a_branch():
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        _cond_in_loop_and_loop_in_cond()
    graph_def = graph.as_graph_def()
    inside = control_flow_of(*graph_def_inputs(graph_def))
    where = {graph_def.node[i].name: reason for i, reason in inside.items()}
    assert where["while/after_cond_in_loop"] == IN_LOOP
    assert where["cond/after_loop_in_branch"] == IN_BRANCH
    assert "outside" not in where


def test_a_graph_without_control_flow_has_nothing_inside():
    graph = tf.Graph()
    with graph.as_default():
        tf.matmul(tf1.placeholder(tf.float32, [2, 2]), tf.constant(np.eye(2, dtype=np.float32)))
    assert control_flow_of(*graph_def_inputs(graph.as_graph_def())) == {}

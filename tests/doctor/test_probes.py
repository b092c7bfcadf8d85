"""plan_probes: which tensors are half-bound, who holds them in half, and what role each plays."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1

from tfamp_rewrite.doctor.probes import (
    ACTIVATION_GRADIENT,
    FORWARD,
    WEIGHT_GRADIENT,
    plan_boundary_probes,
    plan_probes,
)
from tfamp_rewrite.graph_rewrite.rewrite import rewrite_graph_def

tf1 = tf.compat.v1


def plan_of(graph, **kwargs):
    graph_def = graph.as_graph_def()
    # compat="latest": sq (a Mul after a MatMul) is half where infer-after-allow applies
    result = rewrite_graph_def(graph_def, target="gpu", compat="latest")
    return plan_probes(graph_def, result.graph_def, result.report, **kwargs)


@pytest.fixture(scope="module")
def training_graph():
    """x -> mm (MatMul) -> sq = mm * mm (Mul) -> sum -> loss; plain SGD."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf1.get_variable("w", initializer=np.ones([8, 4], np.float32))
        mm = tf.linalg.matmul(x, w, name="mm")
        loss = tf.reduce_sum(tf.multiply(mm, mm, name="sq"), name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph


def test_outputs_of_converted_nodes_and_half_reads_of_float_tensors_are_probed(training_graph):
    probes = {p.tensor: p for p in plan_of(training_graph).probes}
    assert {"x:0", "mm:0", "sq:0"} <= set(probes)
    # mm's output is held in half by mm itself and by its converted reader sq
    assert [n.name for n in probes["mm:0"].half_nodes][:2] == ["mm", "sq"]
    assert probes["mm:0"].category == "allow" and probes["sq:0"].category == "infer"
    # the placeholder stays float32 but the MatMul reads it through a Cast to half
    assert probes["x:0"].op == "Placeholder" and "mm" in [n.name for n in probes["x:0"].half_nodes]
    # Shape only reads the shape: never a reason to keep a tensor float32
    assert all(n.op != "Shape" for p in probes.values() for n in p.half_nodes)


def test_roles_follow_the_gradient_seed(training_graph):
    roles = {p.tensor: p.role for p in plan_of(training_graph).probes}
    assert roles["mm:0"] == roles["sq:0"] == roles["x:0"] == FORWARD
    assert roles["gradients/mm_grad/MatMul_1:0"] == WEIGHT_GRADIENT     # dL/dw, read by the optimizer
    assert roles["gradients/mm_grad/MatMul:0"] == ACTIVATION_GRADIENT   # dL/dx
    assert roles["gradients/sq_grad/Mul:0"] == ACTIVATION_GRADIENT


def test_named_weight_gradients_count_as_such():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf1.get_variable("w", initializer=np.ones([8, 4], np.float32))
        loss = tf.reduce_sum(tf.nn.relu(tf.linalg.matmul(x, w, name="mm")), name="loss")
        (grad,) = tf1.gradients(loss, [w])
    roles = {p.tensor: p.role for p in plan_of(graph).probes}
    assert roles[grad.name] == ACTIVATION_GRADIENT   # nothing reads it yet
    roles = {p.tensor: p.role for p in plan_of(graph, weight_gradients=[grad.name]).probes}
    assert roles[grad.name] == WEIGHT_GRADIENT


def test_a_weight_gradient_reshaped_on_its_way_to_the_optimizer_is_one():
    """conv1d runs a Conv2D on an expanded kernel: the kernel's gradient is a
    Conv2DBackpropFilter reshaped back, and that filter gradient holds its values."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 16, 3], name="x")
        kernel = tf1.get_variable("kernel", initializer=np.ones([3, 3, 8], np.float32))
        loss = tf.reduce_sum(tf.nn.relu(tf.nn.conv1d(x, kernel, 1, "SAME")), name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    roles = {p.tensor: p for p in plan_of(graph).probes}
    (filter_gradient,) = [p for p in roles.values() if p.op == "Conv2DBackpropFilter"]
    assert filter_gradient.role == WEIGHT_GRADIENT


def test_what_a_loss_scaled_step_unscales_is_a_weight_gradient():
    """The unscale divides the weight gradients by the loss scale: its outputs overflow only
    where the scaled gradients did, so the scale's rule is theirs, not a forward value's."""
    import tfamp_rewrite

    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf1.get_variable("w", initializer=np.ones([8, 4], np.float32))
        loss = tf.reduce_sum(tf.nn.relu(tf.linalg.matmul(x, w, name="mm")), name="loss")
        tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
    graph_def = graph.as_graph_def()
    result = rewrite_graph_def(graph_def, target="gpu", compat="latest")
    probes = (plan_probes(graph_def, result.graph_def, result.report).probes
              + plan_boundary_probes(graph_def, result.report))
    unscaled = {p.tensor: p.role for p in probes if "unscale_and_check_finite/" in p.node}
    assert unscaled and set(unscaled.values()) == {WEIGHT_GRADIENT}, unscaled
    assert {p.role for p in probes if p.node == "mm"} == {FORWARD}


def test_tensors_inside_a_while_loop_are_not_probed():
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.constant(np.eye(4, dtype=np.float32), name="w")
        looped = tf1.while_loop(lambda i, v: i < 3,
                                lambda i, v: (i + 1, tf.linalg.matmul(v, w, name="inner")),
                                [tf.constant(0), x])[1]
        tf.linalg.matmul(tf.identity(looped, name="after"), w, name="outer")
    plan = plan_of(graph)
    names = {p.node for p in plan.probes}
    assert "outer" in names and not any("inner" in name for name in names)
    assert plan.skipped.get("in a while loop", 0) > 0


def test_what_follows_an_inner_cond_inside_a_branch_is_not_probed():
    """A MatMul after an inner cond's Merge is still in the outer branch: a probe on it
    fails every run that does not take that branch ("Retval does not have value")."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.constant(np.eye(4, dtype=np.float32), name="w")
        hidden = tf.linalg.matmul(x, w, name="hidden")
        p = tf1.placeholder_with_default(False, [], name="p")
        q = tf1.placeholder_with_default(False, [], name="q")

        def outer_branch():
            inner = tf1.cond(q, lambda: hidden * 2.0, lambda: hidden - 1.0)
            return tf.linalg.matmul(inner, w, name="after_inner_merge")

        out = tf1.cond(p, outer_branch, lambda: tf.identity(hidden))
        tf.linalg.matmul(out, w, name="outer")
    plan = plan_of(graph)
    names = {p.node for p in plan.probes}
    assert {"hidden", "outer"} <= names and "cond/after_inner_merge" not in names
    assert plan.skipped.get("in a cond branch", 0) > 0
    probed = [p.tensor for p in plan.probes]
    with tf1.Session(graph=graph) as session:  # every probe can be fetched, branch taken or not
        session.run(probed, {"x:0": np.ones([4, 4], np.float32)})

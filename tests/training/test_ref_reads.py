"""A reader of a TF1 reference variable that waits on a write sees the written value
(ref_reads.py): the rewrite's Cast of the variable copied its value before the write."""
import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1

import tfamp_rewrite

tf1 = tf.compat.v1
pytestmark = pytest.mark.usefixtures("cpu_target_and_fresh_log", "emulated_numerics")


def test_a_matmul_waiting_on_an_assignment_reads_the_assigned_value():
    """ALS's second half-step: the MatMul under control_dependencies([assign]) saw the old
    value in about half of the runs."""
    graph = tf.Graph()
    with graph.as_default():
        factors = tf1.get_variable("factors", initializer=np.ones([4, 4], np.float32), use_resource=False)
        new = tf1.placeholder(tf.float32, [4, 4], name="new")
        assign = tf1.assign(factors, new)
        with tf.control_dependencies([assign]):
            product = tf.matmul(factors, tf.ones([4, 1]), name="product")
        init = tf1.global_variables_initializer()
    with tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        assert session.rewrite_reports[-1].decision("product").dtype == "float16"
        stale = sum(int(session.run(product, {new: np.full([4, 4], i + 2.0, np.float32)})[0, 0]
                        != 4 * (i + 2)) for i in range(100))
    assert stale == 0


def test_a_generator_step_after_the_discriminators_reads_its_updated_weights():
    """Alternating GAN updates in one run: the second step, built under
    control_dependencies([first step]), computes its gradient from the first step's updated
    weights (the first step applies in the loss scaling's cond)."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf1.get_variable("x", initializer=np.ones((1, 4), np.float32), use_resource=False)
        w = tf1.get_variable("w", initializer=np.full((4, 4), 0.01, np.float32), use_resource=False)
        y = tf.matmul(x, w)
        first = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(0.5)).minimize(
            tf.reduce_sum(y), var_list=[w])
        with tf.control_dependencies([first]):
            second = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1.0)).minimize(
                1e-2 * tf.reduce_sum(y), var_list=[x])
        init = tf1.global_variables_initializer()

    def stepped(session_class):
        with session_class(graph=graph) as session:
            session.run(init)
            session.run(second)
            return session.run(x)

    expected = stepped(tf1.Session)  # from w after Adam's step: about -0.49
    np.testing.assert_allclose(expected, np.full((1, 4), 1.0196), rtol=1e-4)
    np.testing.assert_allclose(stepped(tfamp_rewrite.Session), expected, rtol=1e-3)


def test_a_training_steps_reads_are_left_shared():
    """A step's forward and backward passes read before its update: nothing is copied."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        w = tf1.get_variable("w", initializer=np.full((4, 4), 0.5, np.float32), use_resource=False)
        loss = tf.reduce_sum(tf.matmul(tf.ones([2, 4]), w))
        train = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
        init = tf1.global_variables_initializer()
    with tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(train)
        assert not [op for op in session._shadow.graph.get_operations() if "tfamp_ordered_read" in op.name]

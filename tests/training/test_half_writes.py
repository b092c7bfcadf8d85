"""A variable a rewrite makes store half values is said once, with the node to keep float32."""
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1

import tfamp_rewrite
from tfamp_rewrite.training import devices

tf1 = tf.compat.v1
SAID = "stores in float32 variable"


@pytest.fixture(autouse=True)
def emulated_cpu_amp(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    monkeypatch.delenv(devices.NODES_TO_EXCLUDE_ENV, raising=False)
    monkeypatch.setattr(devices, "_logged", set())


def federated_average(average_by):
    """Two clients' weights and a server's, set to their 0.3 / 0.7 average (FedAvg's
    aggregation): ``average_by`` "tensordot" (a MatMul, converted) or "sum" (float32)."""
    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.RandomState(0)
        clients = [tf1.Variable(rng.randn(1000).astype(np.float32), name="client%d" % i) for i in range(2)]
        server = tf1.Variable(tf.zeros([1000]), name="server")
        if average_by == "tensordot":
            average = tf.tensordot(tf.constant([0.3, 0.7]), tf.stack(clients), axes=1)
        else:
            average = 0.3 * clients[0] + 0.7 * clients[1]
        aggregate = server.assign(average)
        step = server.assign_add(tf.tensordot(tf.constant([0.5, 0.5]), tf.stack(clients), axes=1) * 0.0)
        init = tf1.global_variables_initializer()
    return graph, init, aggregate, step, clients, server


def aggregated(average_by, caplog):
    graph, init, aggregate, step, clients, server = federated_average(average_by)
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            session.run(aggregate)
            session.run(step)  # an increment: its rounded step is no stored value's rounding
            first, second, stored = session.run(clients + [server])
    exact = 0.3 * first.astype(np.float64) + 0.7 * second.astype(np.float64)
    return np.abs(stored - exact).max(), [r.getMessage() for r in caplog.records if SAID in r.getMessage()]


def test_a_weighted_average_a_half_matmul_computes_is_said_with_its_fix(monkeypatch, caplog):
    error, said = aggregated("tensordot", caplog)
    assert error > 1e-4                                     # float16's part in 2048
    (line,) = said
    assert re.search(r"'(Assign|AssignVariableOp)' stores in float32 variable 'server' a value "
                     r"float16 computes \('Tensordot/MatMul', MatMul, converted\)", line)
    # the MatMul that rounds, and the Reshape passing its value on (it would round it again)
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^Tensordot$,^Tensordot/MatMul$'" in line
    monkeypatch.setenv(devices.NODES_TO_EXCLUDE_ENV, "^Tensordot$,^Tensordot/MatMul$")   # the fix it gives
    monkeypatch.setattr(devices, "_logged", set())
    caplog.clear()
    error, said = aggregated("tensordot", caplog)
    assert error < 1e-6 and said == []


def test_a_running_maximum_is_traced_past_the_nodes_passing_it_to_the_one_that_rounds(monkeypatch, caplog):
    """Post-training calibration: amax = maximum(amax, reduce_max(relu(x @ w))).  The line
    named 'Maximum', which only passes on a value the half MatMul rounded: with it kept
    float32 the variable still stored float16's 21.0 for float32's 21.0059.  It names the
    whole path, and with that setting the variable stores float32's value."""
    rng = np.random.RandomState(0)
    inputs = rng.standard_normal([64, 32]).astype(np.float32)
    weights = rng.standard_normal([32, 16]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [64, 32])
        activation = tf.nn.relu(tf.matmul(x, tf.constant(weights)), name="act")
        amax = tf1.get_variable("amax", initializer=0.0, trainable=False)
        calibrate = tf1.assign(amax, tf.maximum(amax, tf.reduce_max(activation)), name="calibrate")
        init = tf1.global_variables_initializer()
    expected = np.float32(np.maximum(inputs @ weights, 0).max())

    def calibrated():
        with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
            with tfamp_rewrite.Session(graph=graph) as session:
                session.run(init)
                return session.run(calibrate, {x: inputs})

    assert calibrated() != pytest.approx(expected, rel=1e-6)   # float16's value
    (line,) = [r.getMessage() for r in caplog.records
               if "stores in float32 variable 'amax'" in r.getMessage()]
    setting = re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", line).group(1)
    assert set(setting.split(",")) == {"^Maximum$", "^Max$", "^act$", "^MatMul$"}
    monkeypatch.setenv(devices.NODES_TO_EXCLUDE_ENV, setting)
    assert calibrated() == pytest.approx(expected, rel=1e-6)


def test_a_value_leaving_a_tf1_while_loop_is_traced_into_the_loop(caplog):
    """A Gibbs chain run in tf.while_loop and stored with tf.assign: the line named the
    loop's Exit as the node computing the value, and its setting changed nothing."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        rng = np.random.RandomState(0)
        weights = tf1.Variable(rng.normal(0, 0.3, [16, 16]).astype(np.float32), name="weights")
        chain = tf1.Variable(rng.normal(0, 1, [8, 16]).astype(np.float32), trainable=False, name="chain")
        _, last = tf1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.tanh(tf.matmul(v, weights))),
                                 [tf.constant(0), chain.read_value()])
        store = tf1.assign(chain, last, name="store")
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(store.op)
    (line,) = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    assert "a value float16 computes ('while/Tanh', Tanh, converted)" in line
    setting = re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", line).group(1).split(",")
    assert "^while/Tanh$" in setting and "^while/Exit_1$" in setting


def test_a_half_value_scaled_in_float32_before_it_is_stored_is_said(monkeypatch, caplog):
    """EM's M-step: tf.assign(mu, matmul(r, x) / n). The float32 division keeps the half
    MatMul's rounding (a relative error of 4e-4) and ended the walk: nothing was said."""
    rng = np.random.RandomState(0)
    data, weights = rng.normal(3.0, 1.0, [500, 4]), rng.dirichlet([1, 1, 1], 500)
    graph = tf.Graph()
    with graph.as_default():
        mu = tf1.Variable(tf.zeros([3, 4]), name="mu")
        r = tf.constant(weights, tf.float32)
        weighted = tf.matmul(r, tf.constant(data, tf.float32), transpose_a=True, name="weighted")
        m_step = tf1.assign(mu, weighted / tf.reduce_sum(r, 0)[:, None], name="m_step")
        init = tf1.global_variables_initializer()
    expected = (weights.T @ data) / weights.sum(0)[:, None]

    def error():
        with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), \
                tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            session.run(m_step.op)
            return np.abs(session.run(mu) / expected - 1).max()

    assert error() > 1e-4
    (line,) = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    assert "'m_step' stores in float32 variable 'mu' a value float16 computes ('weighted'" in line
    monkeypatch.setenv(devices.NODES_TO_EXCLUDE_ENV, "^weighted$")
    assert error() < 1e-6


def test_a_half_value_scaled_in_float32_inside_a_while_loop_is_said(monkeypatch, caplog):
    """EM iterated in a tf.while_loop, its result stored: the loop's float32 Exit and Merge
    ended the walk before the division and the half MatMul, and nothing was said."""
    rng = np.random.RandomState(0)
    data = rng.normal(3.0, 1.0, [500, 4]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf.constant(data)
        mu = tf1.Variable(tf.zeros([3, 4]), name="mu")

        def m_step(i, means):
            resp = tf.nn.softmax(-tf.reduce_sum(tf.square(x[None] - means[:, None]), -1), axis=0)
            return i + 1, tf.matmul(resp, x, name="weighted") / tf.reduce_sum(resp, 1, keepdims=True)

        _, fitted = tf1.while_loop(lambda i, m: i < 3, m_step, [tf.constant(0), tf.constant(data[:3])])
        store = tf1.assign(mu, fitted, name="store")
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as plain:
        plain.run(init)
        expected = plain.run(store)

    def error():
        with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), \
                tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            return np.abs(session.run(store) / expected - 1).max()

    assert error() > 1e-4
    (line,) = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    assert "'store' stores in float32 variable 'mu' a value float16 computes ('while/weighted'" in line
    monkeypatch.setenv(devices.NODES_TO_EXCLUDE_ENV, re.search(r"EXCLUDE='([^']*)'", line).group(1))
    assert error() < 1e-5


@pytest.mark.parametrize("update", ["pagerank", "increment"])
def test_a_half_value_plus_a_term_is_said_and_an_increment_is_not(caplog, update):
    """PageRank's r = 0.85 * M @ r + 0.15 / n: the float32 sum ended the walk before the
    half MatMul, and the ranks held float16's precision unsaid.  A step w - lr * g added
    to the variable itself is an increment, rounded as a step only: not said."""
    graph = tf.Graph()
    with graph.as_default():
        links = tf.constant(np.random.RandomState(0).dirichlet(np.ones(64), 64).T.astype(np.float32))
        r = tf1.Variable(tf.fill([64, 1], 1.0 / 64), name="ranks")
        if update == "pagerank":
            new = 0.85 * tf.matmul(links, r, name="spread") + 0.15 / 64
        else:
            new = r - 0.01 * tf.matmul(links, r, name="spread")
        step = tf1.assign(r, new, name="step")
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(step.op)
    said = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    if update == "increment":
        assert said == []
        return
    (line,) = said
    assert "'step' stores in float32 variable 'ranks' a value float16 computes ('spread'" in line


def test_an_unrolled_carry_is_kept_float32_whole_by_the_setting_said(monkeypatch, caplog):
    """A truncated learned-optimizer unroll: theta + theta @ w three times, stored back.  The
    line named the last sum and MatMul; kept float32, the write still stored the earlier
    sums' half theta, and each rerun moved the line one step up the chain."""
    graph = tf.Graph()
    with graph.as_default():
        theta_variable = tf1.get_variable("theta", initializer=tf.ones([4, 4]) * 0.3, trainable=False)
        w = tf1.get_variable("w", initializer=tf.eye(4) * 1e-3)
        theta = theta_variable.read_value()
        for _ in range(3):
            theta = theta + tf.matmul(theta, w)
        carry = tf1.assign(theta_variable, theta, name="carry")
        init = tf1.global_variables_initializer()

    def carried():
        with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), \
                tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(50):
                session.run(carry.op)
            return session.run(theta_variable)[0, 0]

    assert abs(carried() - 0.3 * 1.001 ** 150) > 1e-4
    (line,) = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    caplog.clear()
    monkeypatch.setattr(devices, "_logged", set())
    monkeypatch.setenv(devices.NODES_TO_EXCLUDE_ENV, re.search(r"EXCLUDE='([^']*)'", line).group(1))
    assert abs(carried() - 0.3 * 1.001 ** 150) < 1e-5
    assert not [r for r in caplog.records if SAID in r.getMessage()]  # nothing more to keep


def test_an_average_float32_computes_is_not_said(caplog):
    error, said = aggregated("sum", caplog)
    assert error < 1e-6 and said == []


def test_a_second_write_to_the_same_variable_built_later_is_not_said_again(caplog):
    """TBPTT builds its state carry again for validation: the line came again, naming the
    new Assign, for the same variable."""
    graph, init, aggregate, step, clients, server = federated_average("tensordot")
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(aggregate)
        with graph.as_default():
            again = server.assign(tf.tensordot(tf.constant([0.6, 0.4]), tf.stack(clients), axes=1))
        session.run(again)
    assert len([r for r in caplog.records if SAID in r.getMessage()]) == 1

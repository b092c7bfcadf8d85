"""A variable a rewrite makes store half values is said once, with the node to keep float32."""
import logging
import re

import numpy as np
import pytest
import tensorflow as tf

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
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^Tensordot/MatMul$'" in line
    monkeypatch.setenv(devices.NODES_TO_EXCLUDE_ENV, "^Tensordot/MatMul$")   # the fix it gives
    monkeypatch.setattr(devices, "_logged", set())
    caplog.clear()
    error, said = aggregated("tensordot", caplog)
    assert error < 1e-6 and said == []


def test_an_average_float32_computes_is_not_said(caplog):
    error, said = aggregated("sum", caplog)
    assert error < 1e-6 and said == []

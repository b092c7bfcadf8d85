"""The doctor's sessions: float32 runs of the user's graph, probed, stopped after the steps asked for."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import tfamp_rewrite
from tfamp_rewrite.training import activation, doctor_session
from tfamp_rewrite.training.doctor_state import DoctorRun, StopDoctor

tf1 = tf.compat.v1


@pytest.fixture
def doctor():
    run = DoctorRun(steps=2, plain_steps=1, compat="latest")  # square (a Mul after a MatMul) is half
    activation.set_doctor(run)
    activation.enable_graph_rewrite()
    yield run
    activation.deactivate()


def test_sessions_probe_the_float32_graph_and_stop_after_the_steps(doctor, caplog):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf1.get_variable("w", initializer=np.full([8, 4], 300.0, np.float32))
        h = tf.linalg.matmul(x, w, name="mm")
        loss = tf.reduce_sum(tf.multiply(h, h, name="square"), name="loss")
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-12), 4.0)
        train_op = optimizer.minimize(loss)
        init = tf1.global_variables_initializer()
        before = graph.as_graph_def()
        session = tf1.Session(graph=graph)
    assert isinstance(session, doctor_session.Session)
    feed = {x: np.ones([2, 8], np.float32)}
    with session:
        session.run(init)
        assert doctor.accumulator.steps == []                   # initialisers compute nothing half-bound
        value = session.run(loss, feed)                          # float32: 2400**2 * 8 is no inf
        assert np.isfinite(value) and value == pytest.approx(2 * 4 * 2400.0 ** 2)
        assert doctor.accumulator.batches == 1 and doctor.accumulator.steps == []
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):  # all-zero tensors: the
            session.run(loss, {x: np.zeros([2, 8], np.float32)})        # probes' inf sentinels
        assert not caplog.records  # are not the user's inf/nan
        for _ in range(3):
            session.run(train_op, feed)
        with pytest.raises(StopDoctor):
            session.run(train_op, feed)
    assert graph.as_graph_def() == before                      # the user's graph is not changed
    assert len(doctor.accumulator.steps) == 2 and len(doctor.accumulator.plain_seconds) == 1
    report = doctor.report()
    roles = {r.node: r.role for r in report.overflow}
    assert roles["square"] == "forward"
    # dL/dx = 2h w^T is ~1e7: beyond float16 at any loss scale (the scale is >= 1)
    assert roles["gradients/mm_grad/MatMul"] == "activation_gradient"
    assert report.scales == [4.0, 4.0] and report.loss_scale.current == 4.0

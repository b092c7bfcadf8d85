"""A rewriting session on a server uses stock TensorFlow ops only.

A parameter server or a worker that only ``join()``s never created a rewriting session, so
it never loaded the op library; nodes placed there cannot be the fused unscale op or the
emulation's RoundToHalf ("Op type not registered ... in binary running on ...").
"""
from __future__ import annotations

import logging
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfamp_rewrite
from tfamp_rewrite.training import devices

tf1 = tf.compat.v1
SERVER = ("import tensorflow.compat.v1 as tf; tf.train.Server(tf.train.ClusterSpec({'local': "
          "['localhost:%d']}), job_name='local', task_index=0).join()")


@pytest.fixture
def server_process():
    """``grpc://localhost:port`` of a TensorFlow server in a process of its own."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-c", SERVER % port],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield "grpc://localhost:%d" % port
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("numerics", ["native", "emulate"])
def test_a_session_on_a_server_process_trains_with_stock_ops(server_process, numerics, monkeypatch,
                                                             caplog):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setattr(devices, "_logged", set())
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf1.get_variable("w", initializer=tf.fill([8, 1], 0.1))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic")
        train = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: np.ones((4, 8), np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(server_process, graph=graph, numerics=numerics) as session:
        session.run(init)
        losses = [session.run([train, loss], feed)[1] for _ in range(20)]
        private_ops = {op.type for op in session._shadow.graph.get_operations()}
    assert losses[-1] < 1e-3 < losses[0]
    assert not private_ops & {"UnscaleAndCheckFinite", "RoundToHalf"}
    said = [r.getMessage() for r in caplog.records if "as its tasks may run in processes" in r.getMessage()]
    assert said and "the loss scaling's unscale and finite check run as stock" in said[0]

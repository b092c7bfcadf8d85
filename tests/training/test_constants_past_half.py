"""Constants a half node would read as inf keep their readers float32 (constants_past_half.py).

A hand-written HMC's position step ``q + eps * p / mass`` with a mass entry of 4.4e5: cast to
float16 the entry is inf, ``p / inf`` is 0, and that coordinate never moves -- finite, wrong,
and unsaid.  TensorFlow's pass casts it all the same; the session keeps the division float32.
"""
import logging

import numpy as np
import pytest
import tensorflow as tf

from tfamp_rewrite.training.constants_past_half import ROUNDS_TO_INF
from tfamp_rewrite.training.session import Session

tf1 = tf.compat.v1
SAID = "rounds to inf"


pytestmark = pytest.mark.usefixtures("cpu_target_and_fresh_log", "emulated_numerics")


def leapfrog_positions(largest_mass):
    """``(graph, positions)``: two leapfrog steps of HMC on ``U(q) = q' A q / 2`` (a MatMul,
    so the step around it runs in half), with a diagonal mass ``[1, largest_mass, 10]``."""
    graph = tf.Graph()
    with graph.as_default():
        mass = tf.constant(np.array([1.0, largest_mass, 10.0], np.float32), name="mass")
        a = tf.constant(np.diag([1.0, largest_mass, 10.0]).astype(np.float32) / 1000, name="a")
        q, p = tf.constant([1.0, 0.01, 1.0]), tf.constant([0.5, 300.0, 2.0])
        for _ in range(2):
            p = p - 0.005 * tf.squeeze(tf.matmul(q[None], a), 0)
            q = q + 0.01 * p / mass
            p = p - 0.005 * tf.squeeze(tf.matmul(q[None], a), 0)
    return graph, q


@pytest.mark.parametrize("largest_mass", [4.4e5, 6e4])
def test_a_constant_past_half_keeps_its_readers_float32_and_is_said(caplog, largest_mass):
    graph, positions = leapfrog_positions(largest_mass)
    with tf1.Session(graph=graph) as plain:
        expected = plain.run(positions)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        moved = session.run(positions)
        decisions = {d.name: d for d in session.rewrite_reports[-1].decisions}
    said = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    if largest_mass < ROUNDS_TO_INF["float16"]:  # fits: the division runs in half, unsaid
        assert not said and decisions["truediv"].converted
        assert moved[1] != pytest.approx(0.01, abs=1e-6)  # the coordinate moved
        return
    (line,) = said
    assert "'mass' (largest |x| 4.4e+05), read by 'truediv', 'truediv_1'" in line
    assert not decisions["truediv"].converted and decisions["MatMul"].converted
    np.testing.assert_allclose(moved, expected, rtol=1e-3)  # float16 gave [.., 0.010002, ..]: unmoved


def test_a_constant_read_through_an_identity_is_found_and_said_once_per_graph(caplog):
    """A constant of -1e5 read through an Identity by two MatMuls, and as a Fill's value: one
    line names them, however many sessions run the graph; their results are float32's."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        scores = tf.matmul(x, tf.ones([8, 8]) * 1e-3)
        big = tf.identity(tf.constant(np.full([8, 8], -1e5, np.float32), name="big"), name="read")
        fetches = [tf.matmul(scores, big, name="first"), tf.matmul(scores, big, name="second"),
                   tf.matmul(scores, tf.fill([8, 8], -1e5, name="filled"), name="third")]
    feed = {x: np.ones([4, 8], np.float32)}
    with tf1.Session(graph=graph) as plain:
        expected = plain.run(fetches, feed)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        for _ in range(2):
            with Session(graph=graph) as session:
                for ours, theirs in zip(session.run(fetches, feed), expected):
                    np.testing.assert_allclose(ours, theirs, rtol=1e-3)
    (line,) = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    assert line.startswith("tfamp_rewrite: 2 constant(s)")
    assert "'big' (largest |x| 1e+05), read by 'first', 'read', 'second'" in line
    assert "'filled/value' (largest |x| 1e+05), read by 'filled', 'third'" in line


def test_a_constant_table_gathered_and_concatenated_keeps_the_way_to_its_readers_float32(caplog):
    """A click model's raw feature table (9e4 at most) looked up by tf.gather and concatenated
    with an embedding before a dense layer: the gather was kept float32 and said, and the
    concatenation then read the gathered 9e4 in half -- two NaN losses before a heal."""
    rng = np.random.RandomState(0)
    table = np.stack([rng.lognormal(6, 1.5, 64), rng.lognormal(4, 0.8, 64)], 1).astype(np.float32)
    table[0, 0] = 90988.0
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int64, [None], name="ids")
        embedding = tf1.get_variable("embedding", [64, 4])
        features = tf.concat([tf.nn.embedding_lookup(embedding, ids), tf.gather(tf.constant(table), ids)], 1)
        logits = tf1.layers.dense(features, 1, kernel_initializer=tf1.constant_initializer(1e-3))
        init = tf1.global_variables_initializer()
    feed = {ids: np.arange(64)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        values = session.run(logits, feed)
        assert not session.heals
    assert np.isfinite(values).all()
    (line,) = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    assert "read by 'GatherV2', 'concat', 'dense/MatMul'" in line

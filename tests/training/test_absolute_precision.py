"""Angles and indices a converted node computes are said once (absolute_precision.py).

float16's spacing is 1 past 1024: the sin of a position encoding's angles from a MatMul, and
a bilinear sampler's pixel positions from a homogeneous MatMul, lose what float32 keeps,
finite and unsaid.  The line names the nodes to keep float32; with them kept, the values
are float32's.
"""
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1

from tfamp_rewrite.training.session import Session

tf1 = tf.compat.v1


pytestmark = pytest.mark.usefixtures("cpu_target_and_fresh_log", "emulated_numerics")


def encoding_graph():
    """Time2Vec's ``sin(t @ freqs)`` for t up to 10000, beside a sin of float32's own."""
    graph = tf.Graph()
    with graph.as_default():
        t = tf1.placeholder(tf.float32, [None, 1], name="t")
        freqs = tf.constant((1.0 / 10000 ** (np.arange(0, 16, 2.0) / 16))[None, :].astype(np.float32))
        tf.sin(tf.matmul(t, freqs, name="angles"), name="encoding")
        tf.sin(t * 2.0, name="own")
    return graph, {"t:0": np.arange(9000, 9064, dtype=np.float32)[:, None]}


def sampler_graph():
    """A bilinear sampler whose pixel positions come from ``[x, y, 1] @ A``."""
    graph = tf.Graph()
    with graph.as_default():
        row = tf.constant(np.linspace(0.0, 1.0, 2048, dtype=np.float32) ** 2)
        points = tf1.placeholder(tf.float32, [None, 3], name="points")
        x = tf.matmul(points, tf.constant([[1.0], [0.0], [0.3]]), name="positions")[:, 0]
        left = tf.floor(x)
        index = tf.cast(left, tf.int32)
        weight = x - left
        tf.add((1 - weight) * tf.gather(row, index), weight * tf.gather(row, tf.minimum(index + 1, 2047)),
               name="sampled")
        tf.cast(x, tf.int32, name="counted")  # an integer of a half value that indexes nothing
    return graph, {"points:0": np.array([[100, 0, 1], [700, 0, 1], [1500, 0, 1]], np.float32)}


@pytest.mark.parametrize("model, fetch, said", [
    (encoding_graph, "encoding:0", "'encoding' takes the sin of an angle float16 computes ('angles', MatMul"),
    (sampler_graph, "sampled:0", "'Cast' makes integer indices of a position float16 computes ('positions'")])
def test_an_angle_or_an_index_half_nodes_compute_is_said_with_the_nodes_to_keep(caplog, model, fetch, said):
    graph, feed = model()
    with tf1.Session(graph=graph) as plain:
        expected = plain.run(fetch, feed)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        rounded = session.run(fetch, feed)
    # the float32 sin and the cast indexing nothing are not said
    (line,) = [r.getMessage() for r in caplog.records
               if "takes the" in r.getMessage() or "makes integer" in r.getMessage()]
    assert said in line
    assert np.abs(rounded - expected).max() > 1e-4  # what float16 did
    setting = re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", line).group(1)
    with Session(graph=graph, nodes_to_exclude=setting.split(",")) as kept:
        np.testing.assert_allclose(kept.run(fetch, feed), expected, rtol=1e-5, atol=1e-6)


def test_a_convergence_test_on_half_iterates_is_said_and_its_setting_converges(caplog):
    """PageRank by power iteration in a TF1 while loop until the L1 change is below 1e-6:
    the half MatMul's iterates stall a part in 2048 away, and the loop ran to its cap of
    3000 for float32's 14 iterations, unsaid."""
    rng = np.random.RandomState(0)
    links = (rng.rand(200, 200) < 0.02).astype(np.float32)
    degree = links.sum(1, keepdims=True)
    google = (0.85 * np.where(degree > 0, links / np.maximum(degree, 1), 1.0 / 200) + 0.15 / 200).T
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        matrix = tf.constant(google.astype(np.float32))

        def body(i, ranks, change):
            spread = tf.matmul(matrix, ranks, name="spread")
            spread = spread / tf.reduce_sum(spread)
            return i + 1, spread, tf.reduce_sum(tf.abs(spread - ranks))

        iterations, _, _ = tf1.while_loop(lambda i, r, change: tf.logical_and(change > 1e-6, i < 500), body,
                                          [0, tf.fill([200, 1], 1.0 / 200), tf.constant(1.0)])
    with tf1.Session(graph=graph) as plain:
        expected = plain.run(iterations)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        assert session.run(iterations) > 2 * expected
    (line,) = [r.getMessage() for r in caplog.records if "decides a while loop" in r.getMessage()]
    setting = re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", line).group(1)
    assert setting == "^while/spread$"
    with Session(graph=graph, nodes_to_exclude=[setting]) as kept:
        assert kept.run(iterations) == expected


def test_an_angle_an_elementwise_chain_computes_is_not_said(caplog):
    """A pendulum integrated by th + dt * om, its om from a half MatMul controller: the angle
    stays within a radian, where float16 keeps its relative precision.  Said as a position
    encoding's lost phase, with (for 500 substeps) a 5 KB setting of every step's sum."""
    graph = tf.Graph()
    with graph.as_default():
        state = tf1.placeholder(tf.float32, [8, 2], name="state")
        controller = tf.matmul(state, tf.ones([2, 1]) * 0.1)
        th, om = state[:, :1], state[:, 1:]
        for _ in range(5):
            om = om + 0.01 * (-9.8 * tf.sin(th) + controller)
            th = th + 0.01 * om
        tf.identity(tf.sin(th), name="height")
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run("height:0", {state: np.full([8, 2], 0.5, np.float32)})
        assert any(d.converted for d in session.rewrite_reports[-1].decisions)  # the controller
    assert not [r for r in caplog.records if "takes the" in r.getMessage()]

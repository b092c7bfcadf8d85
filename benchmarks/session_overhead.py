"""Per-run overhead of tfamp_rewrite.Session, and step time of our LossScaleOptimizer.

1. ``Session.run`` overhead: a tiny graph (``a + b`` with a fed ``a``) run many times by
   ``tf.compat.v1.Session`` and by ``tfamp_rewrite.Session`` (rewrite target ``cpu``),
   interleaved in rounds; prints microseconds per run and our extra cost.
   Target: <= 20 us per run.
2. Training step time: the same float32 conv-net graph trained through
   ``tfamp_rewrite.LossScaleOptimizer`` and through TensorFlow's
   ``tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer`` (both dynamic loss
   scaling, plain sessions, no rewrite), interleaved; prints ms per step and the ratio.
   Target: ratio <= 1.0.

Usage: python benchmarks/session_overhead.py [--runs 20000] [--steps 200]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TFAMP_REWRITE_TARGET"] = "cpu"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfamp_rewrite  # noqa: E402

tf1 = tf.compat.v1


def time_runs(session, fetch, feed, runs):
    start = time.perf_counter()
    for _ in range(runs):
        session.run(fetch, feed)
    return (time.perf_counter() - start) / runs


def session_overhead(runs, rounds=5):
    graph = tf.Graph()
    with graph.as_default():
        a = tf1.placeholder(tf.float32, [], name="a")
        total = a + tf.constant(1.0)
    feed = {a: 1.0}
    plain, ours = tf1.Session(graph=graph), tfamp_rewrite.Session(graph=graph)
    for session in (plain, ours):
        time_runs(session, total, feed, 200)  # warm up
    plain_times, our_times = [], []
    for _ in range(rounds):
        plain_times.append(time_runs(plain, total, feed, runs // rounds))
        our_times.append(time_runs(ours, total, feed, runs // rounds))
    plain.close()
    ours.close()
    return statistics.median(plain_times), statistics.median(our_times)


def conv_net_training(optimizer_factory, seed=0):
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, [64, 16, 16, 3])
        labels = tf1.placeholder(tf.int32, [64])
        net = tf1.layers.conv2d(images, 32, 3, padding="same", activation=tf.nn.relu)
        net = tf1.layers.conv2d(net, 64, 3, padding="same", activation=tf.nn.relu)
        net = tf1.layers.dense(tf1.layers.flatten(tf1.layers.max_pooling2d(net, 2, 2)), 10)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, net)
        train = optimizer_factory(tf1.train.MomentumOptimizer(0.01, 0.9)).minimize(loss)
        init = tf1.global_variables_initializer()
    rng = np.random.default_rng(seed)
    feed = {images: rng.standard_normal((64, 16, 16, 3)).astype(np.float32),
            labels: rng.integers(0, 10, 64).astype(np.int32)}
    session = tf1.Session(graph=graph)
    session.run(init)
    return session, train, feed


def optimizer_step_times(steps, rounds=5):
    ours = conv_net_training(lambda opt: tfamp_rewrite.LossScaleOptimizer(opt, "dynamic"))
    theirs = conv_net_training(
        lambda opt: tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, "dynamic"))
    for session, train, feed in (ours, theirs):
        time_runs(session, train, feed, 10)
    our_times, their_times = [], []
    for _ in range(rounds):
        their_times.append(time_runs(*theirs, steps // rounds))
        our_times.append(time_runs(*ours, steps // rounds))
    return statistics.median(our_times), statistics.median(their_times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    plain, ours = session_overhead(args.runs)
    print("\nSession.run on a tiny graph (median of 5 interleaved rounds, %d runs)" % args.runs)
    print("  %-30s %10s" % ("session", "us/run"))
    print("  %-30s %10.1f" % ("tf.compat.v1.Session", plain * 1e6))
    print("  %-30s %10.1f" % ("tfamp_rewrite.Session", ours * 1e6))
    print("  overhead: %.1f us per run (target <= 20)" % ((ours - plain) * 1e6))
    ours_step, theirs_step = optimizer_step_times(args.steps)
    print("\nTraining step, same fp32 conv net, dynamic loss scaling (fused op: %s)"
          % tfamp_rewrite.fused_op_available())
    print("  %-45s %10s" % ("optimizer", "ms/step"))
    print("  %-45s %10.2f" % ("tf MixedPrecisionLossScaleOptimizer", theirs_step * 1e3))
    print("  %-45s %10.2f" % ("tfamp_rewrite.LossScaleOptimizer", ours_step * 1e3))
    print("  ratio ours/TF: %.2f (target <= 1.0)" % (ours_step / theirs_step))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

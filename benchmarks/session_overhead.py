"""Per-run overhead of tfamp_rewrite.Session, and step time of our LossScaleOptimizer.

1. ``Session.run`` overhead: tiny graphs (``a + 1`` with a fed ``a``, and one loss-scaled
   training step whose rewrite converts nothing) run many times by ``tf.compat.v1.Session``
   and by ``tfamp_rewrite.Session`` (rewrite target ``cpu``), alternating run by run; prints
   median microseconds per run and our extra cost.  Target: <= 20 us per inference run.
2. Training step time: the same float32 conv-net graph trained through
   ``tfamp_rewrite.LossScaleOptimizer`` and through TensorFlow's
   ``tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer`` (both dynamic loss
   scaling, plain sessions, no rewrite), interleaved; prints ms per step and the ratio, for
   a 2-conv net, a 16-conv net with batch norm (many small gradients) and a net with an
   8.5 M-parameter dense block.  Ours runs twice: as the user's graph holds it (stock ops,
   what a session that does not rewrite runs) and with its unscale groups fused, as a
   rewriting session runs it (fused_op/fusable.py; the rest of the graph left float32 so
   the three compare).  Target: fused ratio <= 1.0.  On small models they are even: one
   fused op per device waits for the whole backward pass where per-gradient checks
   overlap with it; the fused op's single pass over memory pays off as the parameter
   count grows.

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
from tfamp_rewrite.fused_op.fusable import fuse_unscale_groups  # noqa: E402

tf1 = tf.compat.v1


def time_runs(session, fetch, feed, runs):
    start = time.perf_counter()
    for _ in range(runs):
        session.run(fetch, feed)
    return (time.perf_counter() - start) / runs


DEEP_LAYERS = 2000  # about 10,000 nodes


def tiny_graph(kind):
    """``((our session, TensorFlow's), fetch, feed)``: ``a + 1`` with a fed ``a``
    ("inference"), ``DEEP_LAYERS`` elementwise layers on it ("inference, deep": costs that grow
    with the graph show there), or one dynamically loss-scaled gradient-descent step on ``w * a``
    ("training step": no allow-list op, so the rewrite converts nothing and both sessions run
    the same kernels; TensorFlow's runs the graph with its unscale group fused, as ours does
    when the compiled op is there), or that step through ``DEEP_LAYERS`` such layers
    ("training step, deep")."""
    graph = tf.Graph()
    with graph.as_default():
        a = tf1.placeholder(tf.float32, [4], name="a")
        if kind == "inference":
            fetch = a + tf.constant(1.0)
        elif kind == "inference, deep":  # no allow-list op either: what grows is the graph
            fetch = a
            for layer in range(DEEP_LAYERS):
                fetch = tf.nn.relu(fetch * tf.constant(1.0) + tf.constant(0.0), name="layer%d" % layer)
        else:
            w = tf1.get_variable("w", [4], initializer=tf1.ones_initializer())
            optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01),
                                                         "dynamic")
            value = w * a
            for layer in range(DEEP_LAYERS if kind == "training step, deep" else 0):
                value = tf.nn.relu(value * tf.constant(1.0) + tf.constant(0.0), name="layer%d" % layer)
            fetch = optimizer.minimize(tf.reduce_sum(tf.square(value)))
            init = tf1.global_variables_initializer()
    theirs = graph
    training = kind.startswith("training step")
    if training and tfamp_rewrite.fused_op_available():
        graph_def = graph.as_graph_def()
        assert fuse_unscale_groups(graph_def)[0], "no unscale group to fuse"
        theirs = tf.Graph()
        with theirs.as_default():
            tf1.import_graph_def(graph_def, name="")
    sessions = tfamp_rewrite.Session(graph=graph), tf1.Session(graph=theirs)
    if training:
        for session in sessions:
            session.run(init.name)
    return sessions, fetch.name, {a.name: np.ones(4, np.float32)}


def session_overhead(runs, kind="inference"):
    """Median single-run times (plain, ours) and the median per-pair difference, for a
    ``tiny_graph`` of ``kind``.

    The sessions alternate run by run and every run is timed on its own, so the medians
    ignore the interruptions a shared machine inflicts on a few runs.
    """
    (ours, plain), fetch, feed = tiny_graph(kind)
    for session in (plain, ours):
        time_runs(session, fetch, feed, 200)  # warm up
    clock = time.perf_counter
    plain_times, our_times = [], []
    for i in range(runs):
        first, second = (plain, ours) if i % 2 else (ours, plain)
        start = clock()
        first.run(fetch, feed)
        middle = clock()
        second.run(fetch, feed)
        end = clock()
        (plain_times, our_times)[first is ours].append(middle - start)
        (plain_times, our_times)[second is ours].append(end - middle)
    plain.close()
    ours.close()
    overhead = statistics.median(o - p for p, o in zip(plain_times, our_times))
    return statistics.median(plain_times), statistics.median(our_times), overhead


def conv_net_training(optimizer_factory, kind="small", seed=0, fuse=False):
    """(session, train op, feed): 2 convs ("small"), 16 convs with batch norm ("deep"), or
    2 convs feeding a 2048x2048 dense layer ("wide", 8.5 M parameters); ``fuse``: the graph
    with its unscale groups fused, as a rewriting session runs it."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, [64, 16, 16, 3])
        labels = tf1.placeholder(tf.int32, [64])
        net = tf1.layers.conv2d(images, 32, 3, padding="same", activation=tf.nn.relu)
        for _ in range(15 if kind == "deep" else 0):
            net = tf1.layers.conv2d(net, 32, 3, padding="same", use_bias=False)
            net = tf.nn.relu(tf1.layers.batch_normalization(net, training=True))
        net = tf1.layers.conv2d(net, 64, 3, padding="same", activation=tf.nn.relu)
        net = tf1.layers.flatten(tf1.layers.max_pooling2d(net, 2, 2))
        if kind == "wide":
            net = tf1.layers.dense(tf1.layers.dense(net, 2048, tf.nn.relu), 2048, tf.nn.relu)
        net = tf1.layers.dense(net, 10)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, net)
        train = optimizer_factory(tf1.train.MomentumOptimizer(0.01, 0.9)).minimize(loss)
        init = tf1.global_variables_initializer()
    rng = np.random.default_rng(seed)
    feed = {images.name: rng.standard_normal((64, 16, 16, 3)).astype(np.float32),
            labels.name: rng.integers(0, 10, 64).astype(np.int32)}
    train, init = train.name, init.name
    if fuse:
        graph_def = graph.as_graph_def()
        assert fuse_unscale_groups(graph_def)[0], "no unscale group to fuse"
        graph = tf.Graph()
        with graph.as_default():
            tf1.import_graph_def(graph_def, name="")
    session = tf1.Session(graph=graph)
    session.run(init)
    return session, train, feed


def optimizer_step_times(steps, kind, rounds=10):
    """Median step times (TF's, ours as stock ops, ours fused) and the medians of the
    per-round ratios of ours to TF's."""
    def ours(opt):
        return tfamp_rewrite.LossScaleOptimizer(opt, "dynamic")

    trainings = [
        conv_net_training(lambda opt: tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, "dynamic"),
                          kind),
        conv_net_training(ours, kind),
        conv_net_training(ours, kind, fuse=True)]
    for session, train, feed in trainings:
        time_runs(session, train, feed, 10)
    times = [[] for _ in trainings]
    for round_ in range(rounds):  # rotate who goes first, so drift does not favour one
        for k in range(len(trainings)):
            which = (k + round_) % len(trainings)
            times[which].append(time_runs(*trainings[which], max(1, steps // rounds)))
    ratios = [statistics.median(o / t for o, t in zip(mine, times[0])) for mine in times[1:]]
    return [statistics.median(t) for t in times], ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args(argv)
    print("\nSession.run on small graphs (%d runs each, alternating; medians of single runs)"
          % args.runs)
    print("  %-20s %12s %12s %12s" % ("run", "TF us/run", "ours us/run", "overhead us"))
    for kind in ("inference", "inference, deep", "training step", "training step, deep"):
        plain, ours, overhead = session_overhead(args.runs, kind)
        print("  %-20s %12.1f %12.1f %12.1f" % (kind, plain * 1e6, ours * 1e6, overhead * 1e6))
    print("  overhead: median of the paired differences; target <= 20 us for an inference run.")
    print("  A training step's run also fetches its step's finite flag and loss scale, and after")
    print("  it the session looks at them (skip watch): the Python work per run is all there is.")
    print("\nTraining step, same fp32 graph, dynamic loss scaling (fused op: %s), ms/step"
          % tfamp_rewrite.fused_op_available())
    print("  %-36s %8s %8s %8s %10s %10s" % ("graph", "TF", "stock", "fused", "stock/TF", "fused/TF"))
    for label, kind in (("2 convs: 5 gradients, 60 k params", "small"),
                        ("16 convs + BN: 53 gradients, 0.2 M", "deep"),
                        ("2 convs + 2048x2048 dense: 8.5 M", "wide")):
        (theirs, stock, fused), (stock_ratio, fused_ratio) = optimizer_step_times(args.steps, kind)
        print("  %-36s %8.2f %8.2f %8.2f %10.2f %10.2f" % (label, theirs * 1e3, stock * 1e3, fused * 1e3,
                                                            stock_ratio, fused_ratio))
    print("  stock: ours in the user's graph (a session that does not rewrite); fused: as a rewriting")
    print("  session runs it. Ratios: medians of the per-round ratios; target fused/TF <= 1.0")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

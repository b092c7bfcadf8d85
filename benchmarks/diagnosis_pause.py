"""The pause of a diagnosed step: the range probes' first run, against the step alone.

    python benchmarks/diagnosis_pause.py [--depths 10,20,40] [--repeats 2]

A skipped-step diagnosis (and the precision monitor's first sample) makes one training run
also fetch the range probes of every half tensor the step computes.  That run is the first
of a new kind, so TensorFlow optimizes (Grappler) and prepares the graph again, now holding
the probes' reductions: a pause the user sees once per graph and heal.  This measures it
on float32 MLP training steps (a dense layer's forward value, activation gradient and
weight gradient are probed, as the diagnosis probes a converted graph's half tensors),
each case in a fresh graph and session of one process:

  * step: the first run of the training step alone (TensorFlow's own first-run cost);
  * probed: the first run of the step with every probe fetched, built with the probe
    template as it is (``doctor/probe_ops.py``) and with the previous template (built by
    ``tf.math.bincount``, a ``Fill`` of the tensor's shape for its zeros), side by side;
  * then one more probed run of each (the cost every later probed run pays).

What the setup favours: the graphs are small next to real models (a ResNet-50 step probes
about a thousand tensors), so the pauses here are the low end; the pause grows with the
number of probes.  Grappler's default optimizers are on, as in a user's session.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfamp_rewrite.doctor import probe_ops  # noqa: E402
from tfamp_rewrite.doctor.limits import limits_for  # noqa: E402
from tfamp_rewrite.doctor.probes import Probe  # noqa: E402

tf1 = tf.compat.v1
warnings.filterwarnings("ignore", category=UserWarning)  # tf.layers' deprecation notices


def previous_tensor_stats(tensor, largest):
    """The template's reductions before this benchmark's change: 43 nodes per probe."""
    values = tf1.abs(tf1.reshape(tensor, [-1]))
    exponents = tf1.bitwise.bitwise_and(tf1.bitwise.right_shift(tf1.bitcast(values, tf.int32), 23), 255)
    zero = tf1.equal(values, 0.0)
    bins = tf1.where(zero, tf1.fill(tf1.shape(exponents), probe_ops.ZERO_BIN), exponents)
    histogram = tf1.math.bincount(bins, minlength=probe_ops.ZERO_BIN + 1, maxlength=probe_ops.ZERO_BIN + 1)
    overflow = tf1.cast(tf1.count_nonzero(tf1.greater(values, largest)), tf.int32)
    counts = tf1.concat([histogram, tf1.reshape(overflow, [1])], 0)
    smallest = tf1.reduce_min(tf1.where(zero, tf1.fill(tf1.shape(values), np.float32(np.inf)), values))
    return counts, tf1.stack([tf1.reduce_max(values), smallest])


def mlp_step(depth, seed=0):
    """(graph, train op, feed, probes): ``depth`` dense layers of 256, Adam, batch 64."""
    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [64, 256])
        labels = tf1.placeholder(tf.int32, [64])
        net = x
        for layer in range(depth):
            net = tf1.layers.dense(net, 256, tf.nn.relu, name="dense%d" % layer)
        logits = tf1.layers.dense(net, 10, name="logits")
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        train = tf1.train.AdamOptimizer(1e-3).minimize(loss)
        init = tf1.global_variables_initializer()
    probes = [Probe(op.outputs[0].name, op.name, op.type, "allow", "forward")
              for op in graph.get_operations()
              if op.type in ("MatMul", "BiasAdd", "Relu", "ReluGrad", "AddN") and op.outputs
              and op.outputs[0].dtype == tf.float32]
    feed = {x: rng.standard_normal((64, 256)).astype(np.float32), labels: rng.integers(0, 10, 64)}
    return graph, train, init, feed, probes


def first_runs(depth, template):
    """Seconds: (step's first run, probes built, first probed run, next probed run)."""
    graph, train, init, feed, probes = mlp_step(depth)
    with tf1.Session(graph=graph) as session:
        session.run(init)
        start = time.perf_counter()
        session.run(train, feed)
        step = time.perf_counter() - start
        start = time.perf_counter()
        if template is not None:
            probe_ops._template.cache_clear()
            original, probe_ops._tensor_stats = probe_ops._tensor_stats, template
        try:
            ops = probe_ops.ProbeOps(graph, limits_for("float16"))
            ops.add(probes)
            ids = ops.select([train], list(feed))
            fetches = ops.fetches(ids)
        finally:
            if template is not None:
                probe_ops._tensor_stats = original
                probe_ops._template.cache_clear()
        built = time.perf_counter() - start
        start = time.perf_counter()
        session.run((train, fetches), feed)
        probed = time.perf_counter() - start
        start = time.perf_counter()
        session.run((train, fetches), feed)
        again = time.perf_counter() - start
    return step, built, probed, again, len(ids)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="10,20,40")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each case; the best is shown")
    args = parser.parse_args(argv)
    print("\nFirst run of a training step with its range probes (seconds; best of %d)" % args.repeats)
    print("  %-7s %7s %-9s %8s %8s %10s %10s %12s" % ("layers", "probes", "template", "step",
                                                       "build", "1st probed", "2nd probed",
                                                       "pause/step"))
    for depth in [int(d) for d in args.depths.split(",")]:
        cases = [("now", None), ("previous", previous_tensor_stats)]
        runs = {label: [] for label, _ in cases}
        for repeat in range(args.repeats):  # who goes first alternates
            for label, template in cases[::1 if repeat % 2 == 0 else -1]:
                runs[label].append(first_runs(depth, template))
        for label, _ in cases:
            step, built, probed, again, count = (min(r[i] for r in runs[label]) for i in range(5))
            print("  %-7d %7d %-9s %8.3f %8.3f %10.3f %10.3f %12.1f" % (
                depth, count, label, step, built, probed, again, (built + probed) / step))
    print("  pause: building the probes plus the first probed run, which TensorFlow optimizes and")
    print("  prepares anew; the second probed run is what each later diagnosed or monitored step costs.")


if __name__ == "__main__":
    main()

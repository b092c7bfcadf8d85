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
  * probed: the first run of the step with every probe fetched, built as ``doctor/probe_ops.py``
    builds them now (groups of tensors reduced together, ~3 nodes per probe) and as it did
    before (one imported template of 29 nodes per probe), side by side;
  * then one more probed run of each (the cost every later probed run pays).

What the setup favours: the graphs are small next to real models (a ResNet-50 step probes
about a thousand tensors), so the pauses here are the low end; the pause grows with the
number of probes.  Grappler's default optimizers are on, as in a user's session.
"""
from __future__ import annotations

import argparse
import functools
import os
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import graph_pb2  # noqa: E402

from tfamp_rewrite.doctor import probe_ops  # noqa: E402
from tfamp_rewrite.doctor.limits import limits_for  # noqa: E402
from tfamp_rewrite.doctor.probes import Probe  # noqa: E402

tf1 = tf.compat.v1
warnings.filterwarnings("ignore", category=UserWarning)  # tf.layers' deprecation notices


class PerProbeTemplate(probe_ops.ProbeOps):
    """The previous layout: every probe's own reductions, a 29-node template imported per probe."""

    def fetches(self, ids):
        bundle = self._bundles.get(ids)
        if bundle is None:
            combined, input_map, returns = graph_pb2.GraphDef(), {}, []
            for probe_id in ids:
                tensor = self._tensors[probe_id]
                template = _per_probe_template(tensor.dtype.as_datatype_enum, float(self.limits.max_finite))
                prefix = "p%d/" % probe_id
                for node in template[0].node:
                    copy = combined.node.add()
                    copy.CopyFrom(node)
                    copy.name = prefix + node.name
                    copy.input[:] = [prefix + name for name in node.input]
                input_map[prefix + template[1]] = tensor
                returns += [prefix + template[2], prefix + template[3]]
            with self.graph.as_default():
                imported = tf1.import_graph_def(combined, input_map=input_map, return_elements=returns,
                                                name="previous_stats")
                bundle = (tf1.stack(imported[0::2]), tf1.stack(imported[1::2]))
            self._bundles[ids] = bundle
        return bundle


@functools.lru_cache(maxsize=None)
def _per_probe_template(dtype, largest):
    graph = tf.Graph()
    with graph.as_default():
        tensor = tf1.placeholder(tf.as_dtype(dtype), name="probed")
        values = tf1.abs(tf1.reshape(tf1.cast(tensor, tf.float32), [-1]))
        exponents = tf1.bitwise.right_shift(tf1.bitcast(values, tf.int32), 23)
        zero = tf1.equal(values, 0.0)
        bins = tf1.where_v2(zero, probe_ops.ZERO_BIN, exponents)
        histogram = tf.raw_ops.Bincount(arr=bins, size=probe_ops.ZERO_BIN + 1,
                                        weights=tf1.constant([], tf.int32))
        overflow = tf1.reduce_sum(tf1.cast(tf1.greater(values, largest), tf.int32), keepdims=True)
        counts = tf1.concat([histogram, overflow], 0)
        smallest = tf1.reduce_min(tf1.where_v2(zero, np.float32(np.inf), values))
        extrema = tf1.stack([tf1.reduce_max(values), smallest])
    return graph.as_graph_def(), tensor.name, counts.name, extrema.name


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


def first_runs(depth, layout):
    """Seconds: (step's first run, probes built, first probed run, next probed run)."""
    graph, train, init, feed, probes = mlp_step(depth)
    with tf1.Session(graph=graph) as session:
        session.run(init)
        start = time.perf_counter()
        session.run(train, feed)
        step = time.perf_counter() - start
        start = time.perf_counter()
        probe_ops._flattening.cache_clear()
        probe_ops._group_template.cache_clear()
        _per_probe_template.cache_clear()
        ops = layout(graph, limits_for("float16"))
        ops.add(probes)
        ids = ops.select([train], list(feed))
        fetches = ops.fetches(ids)
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
    print("  %-7s %7s %-10s %8s %8s %10s %10s %12s" % ("layers", "probes", "layout", "step",
                                                       "build", "1st probed", "2nd probed",
                                                       "pause/step"))
    for depth in [int(d) for d in args.depths.split(",")]:
        cases = [("grouped", probe_ops.ProbeOps), ("per probe", PerProbeTemplate)]
        runs = {label: [] for label, _ in cases}
        for repeat in range(args.repeats):  # who goes first alternates
            for label, layout in cases[::1 if repeat % 2 == 0 else -1]:
                runs[label].append(first_runs(depth, layout))
        for label, _ in cases:
            step, built, probed, again, count = (min(r[i] for r in runs[label]) for i in range(5))
            print("  %-7d %7d %-10s %8.3f %8.3f %10.3f %10.3f %12.1f" % (
                depth, count, label, step, built, probed, again, (built + probed) / step))
    print("  pause: building the probes plus the first probed run, which TensorFlow optimizes and")
    print("  prepares anew; the second probed run is what each later diagnosed or monitored step costs.")


if __name__ == "__main__":
    main()

"""Emulated AMP on an embedding model: the table read in float32, only the picked rows rounded.

    python benchmarks/emulated_embedding.py [--rows 10000,50000,200000] [--width 128]
                                            [--ids 256] [--steps 40]

A TF1 embedding table is a reference variable, and the pass casts it to half where its
gather feeds half nodes (as TensorFlow's pass does: Gather is a clear op).  Emulation
(``numerics="emulate"``) used to round that whole table every step before the gather
picked a few rows; it now gathers from the float32 table and rounds the picked rows,
which gives the same bits.  Per table size, one graph (ids -> embedding_lookup ->
dense -> softmax cross-entropy, SGD) runs three ways, each in its own session:

* float32: the graph as written;
* emulated: ``rewrite_graph_def(numerics="emulate")``, rounding with RoundToHalf as
  sessions do (``use_rounding_op``);
* emulated, table rounded whole: the same graph with a RoundToHalf of the whole table
  before the gather (what emulation did before).

Training steps alternate session by session and are timed one by one; the table gives
medians and each one's ratio to float32.  This favours nothing in particular: same
feeds every step (warm caches for all three), no input pipeline.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.fused_op import op as fused_op
from tfamp_rewrite.fused_op import round_to_half as rounding
from tfamp_rewrite.graph_rewrite.rounding import HALF_TYPE_ATTR, ROUND_OP_TYPE, use_rounding_op

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
from cpu_features import describe_cpu  # noqa: E402

tf1 = tf.compat.v1
FETCHES, FEEDS = ["train_op", "loss"], ["ids", "labels"]
VARIANTS = ("float32", "emulated", "emulated, table rounded whole")


def embedding_model(rows, width, ids, classes=64):
    """The GraphDef and a feed dict: ``ids`` looked up in a ``rows`` x ``width`` table."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        picked = tf1.placeholder(tf.int32, [ids], name="ids")
        labels = tf1.placeholder(tf.int32, [ids], name="labels")
        table = tf1.get_variable("embeddings", [rows, width], use_resource=False)
        logits = tf1.layers.dense(tf.nn.embedding_lookup(table, picked), classes, name="logits")
        loss = tf.identity(tf1.losses.sparse_softmax_cross_entropy(labels, logits), name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
        tf1.global_variables_initializer()  # named "init"
    rng = np.random.default_rng(0)
    feeds = {"ids:0": rng.integers(0, rows, ids).astype(np.int32),
             "labels:0": rng.integers(0, classes, ids).astype(np.int32)}
    return graph.as_graph_def(), feeds


def emulated(graph_def):
    """The graph as an emulating session runs it."""
    result = rewrite_graph_def(graph_def, fetches=FETCHES, feeds=FEEDS, target="cpu", numerics="emulate")
    assert result.report.emulation.gathers_rounding_rows == 1, "the gather still reads a rounded table"
    use_rounding_op(result.graph_def, result.report.emulation)
    return result.graph_def


def with_table_rounded_whole(graph_def):
    """``graph_def`` (emulated) with the gather reading a RoundToHalf of the whole table."""
    whole = type(graph_def)()
    whole.CopyFrom(graph_def)
    node = whole.node.add()
    node.name, node.op = "embeddings/read-rounded-whole", ROUND_OP_TYPE
    node.input.append("embeddings/read")
    node.attr[HALF_TYPE_ATTR].type = tf.float16.as_datatype_enum
    (gather,) = [n for n in whole.node if n.name == "embedding_lookup"]
    gather.input[0] = node.name
    return whole


def session_for(graph_def):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    session = tf1.Session(graph=graph)
    session.run("init")
    return session


def step_times(graph_defs, feeds, steps):
    """Median seconds per training step of each graph, steps alternating between them."""
    sessions = [session_for(g) for g in graph_defs]
    for session in sessions:
        for _ in range(5):
            session.run(FETCHES, feeds)
    samples = [[] for _ in sessions]
    for _ in range(steps):
        for session, times in zip(sessions, samples):
            start = time.perf_counter()
            session.run(FETCHES, feeds)
            times.append(time.perf_counter() - start)
    for session in sessions:
        session.close()
    return [statistics.median(times) for times in samples]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="10000,50000,200000")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--ids", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    if not rounding.round_to_half_available():
        print("RoundToHalf is unavailable here (see the log above); nothing to compare.")
        return 1
    fused_op.loader().load()  # registers RoundToHalf for the graphs imported below
    print("CPU: %s; %d ids per step, width %d; median ms per training step of %d, alternating"
          % (describe_cpu(), args.ids, args.width, args.steps))
    print("%10s" % "rows" + "".join("%34s" % v for v in VARIANTS))
    for rows in (int(r) for r in args.rows.split(",")):
        graph_def, feeds = embedding_model(rows, args.width, args.ids)
        now = emulated(graph_def)
        times = step_times([graph_def, now, with_table_rounded_whole(now)], feeds, args.steps)
        print("%10d" % rows + "".join(
            "%34s" % ("%.2f ms (%.2fx fp32)" % (1e3 * t, t / times[0])) for t in times))
    return 0


if __name__ == "__main__":
    sys.exit(main())

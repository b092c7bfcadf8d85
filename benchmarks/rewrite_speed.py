"""Speed of our rewrite against TensorFlow's own Grappler AMP pass, side by side.

Training graphs of ~6 k, ~60 k and ~600 k nodes: a transformer training tower (attention,
layer norm, feed-forward, Adam; ~780 nodes) replicated side by side as a multi-tower
graph.  For each size, in one process and interleaved, it times

* ours:   ``rewrite_graph_def(graph_def, fetches, feeds, target="cpu")`` (copy, index,
          paint, casts and the full per-node report);
* TF:     ``tf_optimizer.OptimizeGraph`` with only ``auto_mixed_precision_cpu`` enabled
          (emulation off), i.e. TensorFlow's C++ pass plus its Grappler item setup,

and prints the best of N runs, the ratio ours/TF and our time per node.
Usage: python benchmarks/rewrite_speed.py [--sizes 6000,60000,600000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"] = "0"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))

from grappler_oracle import OPTIMIZERS, meta_graph_for, oracle_compat, oracle_lists  # noqa: E402
from model_graphs import transformer_block  # noqa: E402
from tensorflow.core.framework import graph_pb2  # noqa: E402
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2  # noqa: E402
from tensorflow.python.grappler import tf_optimizer  # noqa: E402

from tfamp_rewrite import rewrite_graph_def  # noqa: E402


def replicate(graph_def, copies):
    """``copies`` renamed copies of ``graph_def`` side by side (tower_<i>/...)."""
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    for i in range(copies):
        prefix = "tower_%d/" % i
        for node in graph_def.node:
            copy = out.node.add()
            copy.CopyFrom(node)
            copy.name = prefix + node.name
            for j, text in enumerate(node.input):
                copy.input[j] = "^" + prefix + text[1:] if text.startswith("^") else prefix + text
            if "_class" in copy.attr:  # colocation constraints name nodes too
                del copy.attr["_class"]
    return out


def tensorflow_pass(graph_def, fetches, feeds):
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.append(OPTIMIZERS["float16"])
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    meta = meta_graph_for(graph_def, fetches, feeds)
    start = time.perf_counter()
    tf_optimizer.OptimizeGraph(config, meta)
    return time.perf_counter() - start


def our_pass(graph_def, fetches, feeds, compat, lists):
    start = time.perf_counter()
    rewrite_graph_def(graph_def, fetches=fetches, feeds=feeds, target="cpu", compat=compat, lists=lists)
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="6000,60000,600000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    tower = transformer_block()
    compat, lists = oracle_compat(), oracle_lists()
    rows = []
    for target in (int(s) for s in args.sizes.split(",")):
        copies = max(1, round(target / len(tower.graph_def.node)))
        graph_def = replicate(tower.graph_def, copies)
        fetches = ["tower_%d/%s" % (i, f) for i in range(copies) for f in tower.fetches]
        feeds = ["tower_%d/%s" % (i, f) for i in range(copies) for f in tower.feeds]
        repeats = args.repeats if len(graph_def.node) < 200000 else 1
        ours, theirs = [], []
        for _ in range(repeats):  # interleaved, so drift affects both alike
            theirs.append(tensorflow_pass(graph_def, fetches, feeds))
            ours.append(our_pass(graph_def, fetches, feeds, compat, lists))
        rows.append((len(graph_def.node), min(ours), min(theirs)))
        print_table(rows)


def print_table(rows):
    print("\n%10s %12s %12s %10s %14s" % ("nodes", "ours (s)", "TF (s)", "ours/TF", "ours us/node"))
    for nodes, ours, theirs in rows:
        print("%10d %12.3f %12.3f %10.2f %14.1f" % (nodes, ours, theirs, ours / theirs, 1e6 * ours / nodes))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

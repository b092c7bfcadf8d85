"""What the hidden inf/nan check costs an inference run, checked every run and sampled.

A rewriting session checks, on runs with no loss-scaled step, the floating tensors that an
argmax, a comparison, a CTC decoder or an integer cast reads below a half node (the values
they return cannot show an inf/nan): a few ops and one more fetched tensor.  It checks each
of a session's first 64 such runs, then one in 16 (training/inference_watch.py: CHECK_*).  This
measures one run of a small classifier (a MatMul, its argmax and an accuracy), the check
done on every run, sampled as sessions do, and never, round-robin in one session on one
machine, and prints microseconds per run and the extra cost over "never".

What the setup favours: a tiny graph, so the check's fixed cost (op dispatch, one more
fetch) is as large a share as it gets; on a real model's run it is the same few tens of
microseconds plus one pass over the checked logits.

Usage: python benchmarks/inference_checks.py [--runs 2000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TFAMP_REWRITE_TARGET"] = "cpu"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfamp_rewrite.training import inference_watch  # noqa: E402
from tfamp_rewrite.training.session import Session  # noqa: E402

tf1 = tf.compat.v1
MODES = (("every run", 10 ** 9, 1),
         ("sampled (as shipped)", inference_watch.CHECK_EVERY_RUN, inference_watch.CHECK_THEN),
         ("never", 0, 10 ** 9))


def classifier():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 64], name="x")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        logits = tf.matmul(x, tf.constant(np.random.default_rng(0).standard_normal([64, 10]),
                                          tf.float32), name="logits")
        predictions = tf.argmax(logits, 1, name="predictions")
        tf.reduce_mean(tf.cast(tf.equal(predictions, labels), tf.float32), name="accuracy")
    rng = np.random.default_rng(1)
    feeds = {"x:0": rng.standard_normal([32, 64]).astype(np.float32),
             "labels:0": rng.integers(0, 10, 32)}
    return graph, ["predictions:0", "accuracy:0"], feeds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs timed per mode and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the modes")
    args = parser.parse_args(argv)
    graph, fetches, feeds = classifier()
    shipped = inference_watch.CHECK_EVERY_RUN, inference_watch.CHECK_THEN
    best = {}
    with Session(graph=graph) as session:
        session.run(fetches, feeds)
        for _ in range(args.rounds):
            for name, every, then in MODES:
                inference_watch.CHECK_EVERY_RUN, inference_watch.CHECK_THEN = every, then
                session._inference._runs = 0
                seconds = min(timeit.repeat(lambda: session.run(fetches, feeds), number=args.runs,
                                            repeat=2)) / args.runs
                best[name] = min(best.get(name, seconds), seconds)
    inference_watch.CHECK_EVERY_RUN, inference_watch.CHECK_THEN = shipped
    base = best["never"]
    print("Hidden inf/nan check on an inference run (%d runs x %d rounds, best):" % (args.runs,
                                                                                  args.rounds))
    print("  %-22s %10s %10s" % ("mode", "us/run", "extra"))
    for name, _, _ in MODES:
        print("  %-22s %10.0f %+9.0f%%" % (name, 1e6 * best[name], 100 * (best[name] / base - 1)))


if __name__ == "__main__":
    main()

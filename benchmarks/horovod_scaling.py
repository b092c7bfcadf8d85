"""Throughput of examples/train_tf1 on 2 Horovod ranks vs 1, float32 and mixed precision (CPU).

    python benchmarks/horovod_scaling.py [--float32-steps 2000] [--mixed-steps 200] [--batch-size 64]

Runs ``train.py --horovod`` on 1 and on 2 ranks (Gloo over 127.0.0.1, started as
horovodrun would), in float32 and with ``--amp`` (the float16 rewrite on the CPU and
dynamic loss scaling), one after the other in this one run.  Each rank gets one CPU
thread, as each rank gets one GPU.  Throughput is training images per second over all
ranks, from rank 0's step time (graph set-up excluded, first step included).

Read the ratios, not the numbers: the cores are shared with other work.  The example's
model is tiny, so in float32 a step is mostly the allreduce's latency and 2 ranks lose;
float16 on a CPU is emulated and slow, so there compute dominates and 2 ranks gain.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "train_tf1", "train.py")
# A rank per core, as a rank per GPU: one TensorFlow process would otherwise use every core.
ONE_CORE_PER_RANK = {"TF_NUM_INTRAOP_THREADS": 1, "TF_NUM_INTEROP_THREADS": 1, "OMP_NUM_THREADS": 1}
PRECISIONS = {"float32": [], "mixed": ["--amp"]}  # name: the example's flags


def images_per_second(run_ranks, ranks, flags, steps, batch_size):
    """Training images per second over ``ranks`` ranks of the example."""
    with tempfile.TemporaryDirectory() as directory:
        output = os.path.join(directory, "result.json")
        run_ranks(
            [TRAIN, "--horovod", *flags, "--steps", str(steps), "--batch-size", str(batch_size),
             "--log-every", str(steps), "--json", output],
            ranks=ranks, timeout=1800, env={"TFAMP_REWRITE_TARGET": "cpu", **ONE_CORE_PER_RANK})
        with open(output) as handle:
            seconds = json.load(handle)["seconds"]
    return steps * batch_size * ranks / seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # float16 runs about 20x slower than float32 on a CPU: fewer steps take as long.
    parser.add_argument("--float32-steps", type=int, default=2000)
    parser.add_argument("--mixed-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    args = parser.parse_args(argv)

    import tensorflow as tf
    from horovod_support import unsupported_reason

    reason = unsupported_reason(tf.__version__)
    if reason:
        print("skipped: " + reason)
        return
    from horovod_launch import run_ranks

    rows = []
    for precision, flags in PRECISIONS.items():
        steps = getattr(args, precision + "_steps")
        one, two = (images_per_second(run_ranks, ranks, flags, steps, args.batch_size) for ranks in (1, 2))
        rows.append((precision, steps, one, two, two / one))
    print("examples/train_tf1, %d images per rank and step, TensorFlow %s, %d CPUs"
          % (args.batch_size, tf.__version__, os.cpu_count()))
    print("%-10s %6s %14s %14s %8s" % ("precision", "steps", "1 rank img/s", "2 ranks img/s", "2 vs 1"))
    for precision, steps, one, two, ratio in rows:
        print("%-10s %6d %14.0f %14.0f %7.2fx" % (precision, steps, one, two, ratio))


if __name__ == "__main__":
    main()

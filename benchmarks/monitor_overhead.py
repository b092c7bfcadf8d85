"""What the precision monitor costs: training with ``TFAMP_REWRITE_MONITOR=N`` against without.

    python benchmarks/monitor_overhead.py [--every 100] [--steps 1000] [--repeats 2]
                                          [--models resnet50,transformer]

Each configuration is one run of ``examples/<model>/main.py --mode training_benchmark
--use_tf_amp`` in its own process (rewrite on the CPU, emulated Tensor Core numerics, the
same seed and synthetic data), alternating monitor off and on ``--repeats`` times.  Reported
per model: throughput with the monitor off and on (the best run of each), their ratio
(the overhead target: <= 5 % at N = 100), and what one probed step costs -- a run with
``TFAMP_REWRITE_MONITOR=1``, every step probed, against the plain one.

What the setup favours: throughput is counted after ``N + 10`` warm-up steps, so the one-time
cost of building the probe ops at the first sampled step is left out (it is paid once per
session, like the rewrite itself); every later sampled step is in.  The data is synthetic
and already in memory: a real input pipeline overlapping the step would hide nothing of the
probes, which run inside the step.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FLAGS = {
    "resnet50": ["--image_size", "32", "--width", "16", "--blocks", "3,4,6,3", "--batch_size", "16",
                 "--lr_warmup_epochs", "0"],
    "transformer": [],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=100, help="TFAMP_REWRITE_MONITOR (default 100)")
    parser.add_argument("--steps", type=int, default=1000, help="measured steps per run (default 1000)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per configuration (default 2)")
    parser.add_argument("--models", default="resnet50,transformer")
    return parser.parse_args(argv)


def run(model: str, steps: int, warmup: int, every: int = 0) -> dict:
    """One training benchmark run; returns its results JSON (throughput, per-step history)."""
    with tempfile.TemporaryDirectory() as results, tempfile.TemporaryDirectory() as monitor_dir:
        command = [sys.executable, os.path.join(ROOT, "examples", model, "main.py"), "--mode",
                   "training_benchmark", "--use_tf_amp", "--results_dir", results,
                   "--num_iter", str(steps + warmup), "--warmup_steps", str(warmup),
                   "--display_every", str(steps + warmup)] + MODEL_FLAGS[model]
        env = dict(os.environ, TFAMP_REWRITE_TARGET="cpu", TFAMP_REWRITE_NUMERICS="emulate",
                   TF_CPP_MIN_LOG_LEVEL="2", TFAMP_REWRITE_MONITOR=str(every),
                   TFAMP_REWRITE_MONITOR_DIR=monitor_dir)
        completed = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        if completed.returncode != 0:
            raise SystemExit("%s failed (exit %d):\n%s" % (model, completed.returncode,
                                                           completed.stdout[-3000:]))
        with open(os.path.join(results, "results_training_benchmark.json")) as handle:
            result = json.load(handle)
        result["monitor_files"] = len(os.listdir(monitor_dir))
        return result


def main(argv=None) -> int:
    args = parse_args(argv)
    warmup = args.every + 10
    rows = []
    for model in args.models.split(","):
        off, on = [], []
        for _ in range(args.repeats):
            off.append(run(model, args.steps, warmup)["throughput"])
            sampled = run(model, args.steps, warmup, args.every)
            assert sampled["monitor_files"] == 1, "the monitor wrote no event file"
            on.append(sampled["throughput"])
        every_step = run(model, 100, 10, every=1)["throughput"]
        plain = max(off)
        rows.append((model, plain, max(on), max(on) / plain, plain / every_step,
                     sorted(round(v, 1) for v in off), sorted(round(v, 1) for v in on)))
    print("\nprecision monitor, TFAMP_REWRITE_MONITOR=%d: throughput after %d warm-up steps, over %d "
          "steps, best of %d runs (emulated AMP on the CPU)" % (args.every, warmup, args.steps, args.repeats))
    print("%-12s %12s %12s %10s %18s   %s" % ("model", "off /s", "on /s", "on/off", "probed step cost",
                                            "all runs off | on"))
    for model, plain, sampled, ratio, cost, offs, ons in rows:
        print("%-12s %12.1f %12.1f %9.3fx %17.2fx   %s | %s" % (
            model, plain, sampled, ratio, cost, offs, ons))
    return 0


if __name__ == "__main__":
    sys.exit(main())

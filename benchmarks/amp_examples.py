"""The examples in fp32, AMP (native and emulated numerics) and AMP+XLA, as tables of ratios.

    python benchmarks/amp_examples.py [--image_size 32 --width 16 --blocks 3,4,6,3 --batch_size 16]
                                      [--num_iter 20 --warmup_steps 5]
                                      [--configs fp32,amp,amp_emulated,amp_xla] [--train_tf1_steps 200]

Each configuration is one run of ``examples/resnet50/main.py --mode training_benchmark
--step_stats`` in its own process (XLA reads its flags once per process), with the
same seed and synthetic data.  Reported per configuration: throughput after the warm-up
steps, and the bytes the executed graph's kernels output in one traced step -- all
outputs, and activations alone (AMP should move about half the activation bytes of
fp32; weights, their fp16 copies and the fp32 gradients make up the rest).  Without a
GPU of compute capability >= 7.0 the rewrite targets the CPU (``TFAMP_REWRITE_TARGET=cpu``),
where TensorFlow's float16 kernels are far slower than its float32 ones: on a CPU, AMP is
not expected to be faster, and the ratios to read are the bytes.  ``AMP emulated``
(``TFAMP_REWRITE_NUMERICS=emulate``) runs the same rewrite on float32 kernels with values
rounded to half (one RoundToHalf op per rounding where the op library loads, else a Cast
pair): its time over fp32's is what emulating Tensor Core numerics costs on a CPU.
``AMP em.Cast`` is the same with ``TFAMP_DISABLE_ROUNDING_OP=1``: stock Cast pairs only,
as a graph written by ``rewrite_graph_def(numerics="emulate")`` runs anywhere.  The
default model has ResNet-50's depth at a quarter of its width, on 32x32 images, to finish
in minutes on a CPU; ``--width 64 --image_size 224 --batch_size 256`` is the real one (GPU).

A second table times ``examples/train_tf1/train.py`` (the conv net of ``make demo``) the
same four ways (fp32, AMP, both emulations): the median time of a training step after the first ten.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(ROOT, "examples", "resnet50", "main.py")
TRAIN_TF1 = os.path.join(ROOT, "examples", "train_tf1", "train.py")
EMULATE = {"TFAMP_REWRITE_NUMERICS": "emulate"}
NATIVE = {"TFAMP_REWRITE_NUMERICS": "native"}
# name: (label, example flags, environment)
CONFIGS = {
    "fp32": ("fp32", [], {}),
    "fp32_xla": ("fp32+XLA", ["--use_xla"], {}),
    "amp": ("AMP", ["--use_tf_amp"], NATIVE),
    "amp_emulated": ("AMP emul.", ["--use_tf_amp"], EMULATE),
    "amp_emulated_casts": ("AMP em.Cast", ["--use_tf_amp"], dict(EMULATE, TFAMP_DISABLE_ROUNDING_OP="1")),
    "amp_xla": ("AMP+XLA", ["--use_tf_amp", "--use_xla"], NATIVE),
    "amp_emulated_xla": ("AMP em.+XLA", ["--use_tf_amp", "--use_xla"], EMULATE),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--blocks", default="3,4,6,3")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--num_iter", type=int, default=20)
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--configs", default="fp32,amp,amp_emulated,amp_emulated_casts,amp_xla",
                        help="comma-separated, from: %s" % ", ".join(CONFIGS))
    parser.add_argument("--train_tf1_steps", type=int, default=200,
                        help="training steps of each train_tf1 run (0: skip that table)")
    args = parser.parse_args(argv)
    args.configs = args.configs.split(",")
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error("unknown --configs %s; choose from %s" % (", ".join(unknown), ", ".join(CONFIGS)))
    return args


def run_config(name, args, results_dir):
    """Runs one configuration in a new process; returns its results JSON (a dict)."""
    command = [sys.executable, MAIN, "--mode", "training_benchmark", "--step_stats",
               "--results_dir", results_dir, "--lr_warmup_epochs", "0",
               "--image_size", str(args.image_size), "--width", str(args.width), "--blocks", args.blocks,
               "--batch_size", str(args.batch_size), "--num_iter", str(args.num_iter),
               "--warmup_steps", str(args.warmup_steps), "--display_every", str(max(1, args.num_iter // 4))]
    command += CONFIGS[name][1]
    env = _environment(CONFIGS[name][2])
    print("== %s: %s" % (CONFIGS[name][0], " ".join(command[1:])), flush=True)
    completed = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    summary = [line for line in completed.stdout.splitlines()
               if " - " in line or "executed graph" in line]
    print("\n".join("   " + line for line in summary), flush=True)
    if completed.returncode != 0:
        raise SystemExit("%s failed (exit %d):\n%s" % (name, completed.returncode, completed.stdout[-3000:]))
    with open(os.path.join(results_dir, "results_training_benchmark.json")) as handle:
        return json.load(handle)


def _environment(extra):
    env = dict(os.environ, **extra)
    env.setdefault("TFAMP_REWRITE_TARGET", "cpu" if not _tensorflow_has_cuda() else "auto")
    return env


def run_train_tf1(name, steps, json_path):
    """``examples/train_tf1/train.py`` as configuration ``name`` (no XLA); returns its results."""
    label, flags, extra = CONFIGS[name]
    command = [sys.executable, TRAIN_TF1, "--steps", str(steps), "--log-every", str(steps),
               "--json", json_path]
    command += ["--amp"] if "--use_tf_amp" in flags else []
    print("== train_tf1 %s: %s" % (label, " ".join(command[1:])), flush=True)
    completed = subprocess.run(command, env=_environment(extra), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    if completed.returncode != 0:
        raise SystemExit("train_tf1 %s failed (exit %d):\n%s" % (name, completed.returncode,
                                                                 completed.stdout[-3000:]))
    with open(json_path) as handle:
        return json.load(handle)


def train_tf1_table(results):
    """Median step time after the first ten steps, against the first configuration's."""
    times = [(label, statistics.median(h["seconds"] for h in result["history"][10:]), result)
             for label, result in results]
    base = times[0][1]
    lines = ["%-11s %14s %8s %11s %9s" % ("config", "step ms (med)", "vs " + results[0][0], "final loss",
                                           "test acc")]
    for label, seconds, result in times:
        lines.append("%-11s %14.2f %8s %11.4f %9.4f" % (
            label, 1e3 * seconds, ratio(seconds, base), result["history"][-1]["loss"],
            result["test_accuracy"]))
    return "\n".join(lines)


def _tensorflow_has_cuda():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf.test.is_built_with_cuda()


def ratio(value, base):
    return "%.2fx" % (value / base) if value and base else "-"


def table(results):
    """The table: one row per configuration, ratios against the first one."""
    base = results[0][1]
    base_graph = base["executed_graph"]
    lines = ["%-11s %10s %8s %14s %8s %14s %8s %11s %s" % (
        "config", base["unit"], "vs " + results[0][0], "activ. MB/step", "vs " + results[0][0],
        "output MB/step", "vs " + results[0][0], "half convs", "XLA clusters")]
    for label, result in results:
        graph = result["executed_graph"]
        half = graph["half_compute_nodes"]
        lines.append("%-11s %10.1f %8s %14.2f %8s %14.2f %8s %11s %s" % (
            label, result["throughput"], ratio(result["throughput"], base["throughput"]),
            graph["activation_bytes"] / 1e6, ratio(graph["activation_bytes"], base_graph["activation_bytes"]),
            graph["output_bytes"] / 1e6, ratio(graph["output_bytes"], base_graph["output_bytes"]),
            "%d/%d" % (half, half + graph["float_compute_nodes"]) if half + graph["float_compute_nodes"]
            else "in XLA",
            "compiled" if graph["xla_compiled"] else "-"))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.configs:
            results.append((CONFIGS[name][0], run_config(name, args, os.path.join(scratch, name))))
    print("\nResNet-50 v1.5 training_benchmark: batch %d, %dx%d synthetic images, width %d, blocks %s, "
          "%d steps after %d warm-up" % (args.batch_size, args.image_size, args.image_size, args.width,
                                          args.blocks, args.num_iter - args.warmup_steps, args.warmup_steps))
    print(table(results))
    print("half convs: conv/matmul nodes the executor ran in half precision (XLA clusters hide theirs);\n"
          "activ. MB: bytes of batch-sized tensors the kernels output in one step; output MB: all outputs, "
          "with\nthe weights' float16 copies and float32 gradients (under XLA: only what clusters return).")
    if results[0][1]["rewrite"] is None and any(r["rewrite"] for _, r in results):
        target = next(r["rewrite"]["target"] for _, r in results if r["rewrite"])
        if target == "cpu":
            print("The rewrite targeted the CPU: TensorFlow's CPU float16 kernels are much slower than its "
                  "float32 ones,\nso AMP is not expected to be faster here; on a Tensor Core GPU it is. "
                  "AMP emul. runs float32 kernels\non values rounded to float16: its ratio is the cost of "
                  "emulating Tensor Core numerics on this CPU.")
    if args.train_tf1_steps:
        tf1_results = []
        with tempfile.TemporaryDirectory() as scratch:
            for name in ("fp32", "amp", "amp_emulated", "amp_emulated_casts"):
                tf1_results.append((CONFIGS[name][0], run_train_tf1(
                    name, args.train_tf1_steps, os.path.join(scratch, name + ".json"))))
        print("\ntrain_tf1 (digits conv net, batch 64): %d steps" % args.train_tf1_steps)
        print(train_tf1_table(tf1_results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

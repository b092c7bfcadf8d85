"""The main demo: the same TF1 script trained in float32 and with AMP, side by side.

1. Trains ``examples/train_tf1/train.py`` (a conv net on scikit-learn's digits) twice in
   this process, from the same seed: as written (float32), then with ``--amp``, the one
   line ``tfamp_rewrite.enable_mixed_precision_graph_rewrite(optimizer)``.
2. Prints the two runs side by side -- loss, loss scale, test accuracy -- and the
   summary of the mixed-precision rewrite the AMP session ran.
3. Writes ``loss_curves.png`` (training loss fp32 vs AMP, and the dynamic loss scale)
   and ``history.json`` to ``--out`` (default ``out/demo``).

Without a GPU of compute capability >= 7.0 the rewrite targets the CPU and emulates a
Tensor Core GPU's numerics (``TFAMP_REWRITE_NUMERICS=emulate``: float32 kernels on values
rounded to float16), so the loss curves are the ones a GPU would draw, on any CPU and at
about float32 speed; ``TFAMP_REWRITE_NUMERICS=native`` runs TensorFlow's CPU float16
kernels instead (much slower, and CPU-dependent).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorflow as tf  # noqa: E402
from runtime import progress, switches  # noqa: E402
from runtime.loss_plot import plot_loss_curves  # noqa: E402
from train_tf1 import train  # noqa: E402

import tfamp_rewrite  # noqa: E402
from tfamp_rewrite.training import devices  # noqa: E402

SEED = 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps of each run")
    parser.add_argument("--out", default=os.path.join("out", "demo"), help="where the plot and JSON go")
    return parser.parse_args(argv)


def train_once(label, argv):
    """Runs train_tf1's ``main(argv)`` in a fresh graph; returns ``(result, graph, seconds)``."""
    print("\n== %s: python examples/train_tf1/train.py %s" % (label, " ".join(argv)), flush=True)
    started = time.time()
    with switches.amp_switch_restored(), tf.Graph().as_default() as graph:
        result = train.main(argv)
    return result, graph, time.time() - started


def side_by_side(fp32, amp, steps):
    """The table of both runs: loss at a few steps, the loss scale, the final accuracy."""
    rows = sorted({1, 2, 5, 10} | set(range(0, steps + 1, max(1, steps // 6))) - {0})
    lines = ["  %6s  %12s  %12s  %12s" % ("step", "fp32 loss", "AMP loss", "loss scale")]
    for step in (s for s in rows if s <= steps):
        f, a = fp32["history"][step - 1], amp["history"][step - 1]
        lines.append("  %6d  %12.4f  %12.4f  %12g" % (step, f["loss"], a["loss"], a["loss_scale"]))
    lines.append("  %6s  %12.4f  %12.4f" % ("test acc", fp32["test_accuracy"], amp["test_accuracy"]))
    lines.append("  %6s  %11.1fs  %11.1fs" % ("time", fp32["seconds"], amp["seconds"]))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    progress.quiet_tensorflow()
    target = devices.session_rewrite_target()[0]
    if target is None:  # no Tensor Core GPU: rewrite the CPU graph, with a GPU's numerics
        target = "cpu"
        tfamp_rewrite.set_rewrite_target(target)
        os.environ.setdefault(devices.NUMERICS_ENV, "emulate")
        print("No Tensor Core GPU: the AMP run rewrites the CPU graph, numerics %s%s" % (
            devices.session_numerics(), " (float32 kernels on values rounded to float16, as a Tensor "
            "Core GPU computes)" if devices.session_numerics() == "emulate" else " (CPU float16 kernels)"))
    common = ["--steps", str(args.steps), "--log-every", str(max(1, args.steps // 3)), "--seed", str(SEED)]
    fp32, _, _ = train_once("float32", common)
    amp, amp_graph, _ = train_once("AMP", common + ["--amp"])

    # The call the AMP session made on its first run: the whole graph, this target.
    report = tfamp_rewrite.rewrite_graph_def(amp_graph.as_graph_def(), target=target,
                                             numerics=devices.session_numerics()).report
    print("\n== The rewrite the AMP session ran on the training graph")
    print(report.summary(max_op_rows=10))
    print("\n== float32 vs AMP, same seed, same batches")
    print(side_by_side(fp32, amp, args.steps))

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "history.json"), "w") as handle:
        json.dump({"fp32": fp32, "amp": amp}, handle)
    plot = plot_loss_curves(os.path.join(args.out, "loss_curves.png"), fp32["history"], amp["history"],
                            title="train_tf1 (digits conv net): float32 vs AMP")
    print("\nplot: %s" % plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

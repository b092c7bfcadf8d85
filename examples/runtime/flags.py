"""The command-line flags every example shares, named as in NVIDIA's example scripts.

``--mode training_benchmark|train|evaluate``, ``--warmup_steps``, ``--num_iter`` with
``--iter_unit batch|epoch``, ``--batch_size``, ``--use_tf_amp``, ``--use_xla``,
``--results_dir``, ``--display_every``, ``--seed``, ``--step_stats``.  A script adds
its own model flags to the parser ``common_parser`` returns.
"""
from __future__ import annotations

import argparse
import math

MODES = ("training_benchmark", "train", "evaluate")


def common_parser(description: str, batch_size: int, num_iter: int, warmup_steps: int,
                  learning_rate: float) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with the shared flags; the arguments set the model's defaults."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="train",
                        help="training_benchmark: time training steps; train: train and checkpoint; "
                             "evaluate: restore the latest checkpoint from --results_dir and evaluate")
    parser.add_argument("--num_iter", type=int, default=num_iter, help="how many --iter_unit to run")
    parser.add_argument("--iter_unit", choices=("batch", "epoch"), default="batch",
                        help="unit of --num_iter")
    parser.add_argument("--warmup_steps", type=int, default=warmup_steps,
                        help="steps left out of the throughput (graph rewrite, XLA compilation, "
                             "first allocations)")
    parser.add_argument("--batch_size", type=int, default=batch_size)
    parser.add_argument("--lr_init", type=float, default=learning_rate, help="initial learning rate")
    parser.add_argument("--use_tf_amp", action="store_true",
                        help="automatic mixed precision: tfamp_rewrite.enable_mixed_precision_graph_rewrite "
                             "(dynamic loss scaling and the float16 graph rewrite)")
    parser.add_argument("--use_xla", action="store_true",
                        help="XLA auto-clustering (global_jit_level ON_1; on a machine without a GPU "
                             "TF_XLA_FLAGS=--tf_xla_cpu_global_jit is added for this process)")
    parser.add_argument("--results_dir", default=None,
                        help="checkpoints, TensorBoard events and results.json go here")
    parser.add_argument("--display_every", type=int, default=10, help="steps between progress lines")
    parser.add_argument("--seed", type=int, default=0, help="graph-level random seed")
    parser.add_argument("--step_stats", action="store_true",
                        help="after the timed steps, trace one more step and report what the executed "
                             "graph ran (half-precision nodes, output bytes, XLA clusters)")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rejects values no run can use, through ``parser.error`` (exit status 2)."""
    for name in ("num_iter", "batch_size", "display_every"):
        if getattr(args, name) < 1:
            parser.error("--%s must be >= 1 (got %d)" % (name, getattr(args, name)))
    if args.warmup_steps < 0:
        parser.error("--warmup_steps must be >= 0 (got %d)" % args.warmup_steps)
    if args.mode == "evaluate" and not args.results_dir:
        parser.error("--mode evaluate restores a checkpoint: give --results_dir of a --mode train run")


def total_steps(num_iter: int, iter_unit: str, batch_size: int, examples_per_epoch: int) -> int:
    """Steps to run: ``num_iter`` batches, or ``num_iter`` epochs of ``examples_per_epoch``."""
    if iter_unit == "batch":
        return num_iter
    return num_iter * max(1, math.ceil(examples_per_epoch / batch_size))

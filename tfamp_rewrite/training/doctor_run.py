"""Runs a program under the precision doctor and writes its report as JSON (``tfamp-rewrite doctor``).

    python -m tfamp_rewrite.training.doctor_run --json OUT [--steps N] [--plain-steps K]
        [--dtype float16|bfloat16] [--target gpu|cpu] [--margin BITS] (script.py | -m module) [ARGS...]

The program runs as ``tfamp-run`` runs it -- ``TF_ENABLE_AUTO_MIXED_PRECISION=1``, so every
``tf.compat.v1.train.Optimizer`` scales its loss, activated when the program imports
TensorFlow -- except that its sessions are the doctor's (``doctor_session``): float32
graphs, probed.  After ``--steps`` probed training steps and ``--plain-steps`` timed
unprobed ones the program is stopped (``StopDoctor``); a program that ends earlier is
reported as far as it got.  OUT receives ``{"report": DoctorReport, "error": None or a
line}``; the exit status is 0, or 3 when the program failed (its traceback is on stderr).
The command line (``saved_graph``'s ``doctor`` command) starts this in a child process, so
TensorFlow's process-wide switches never touch the converter's own process.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from ..graph_rewrite.report import json_safe

FAILED = 3


def _parser():
    parser = argparse.ArgumentParser(prog="python -m tfamp_rewrite.training.doctor_run",
                                     description="Run a TF1 program under the precision doctor.")
    parser.add_argument("--json", required=True, help="where to write the report")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--plain-steps", type=int, default=3)
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    parser.add_argument("--target", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--margin", type=int, default=3)
    parser.add_argument("--compat", help="whose AMP pass (default: $TFAMP_REWRITE_COMPAT or auto)")
    parser.add_argument("-m", dest="module")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not args.module and not args.program:
        _parser().error("name a script to run, or a module with -m")
    os.environ.setdefault("TF_ENABLE_AUTO_MIXED_PRECISION", "1")
    from . import activation, doctor_state
    from .run import run_program

    run = doctor_state.DoctorRun(args.dtype, args.steps, args.plain_steps, args.target,
                                 margin_log2=args.margin, compat=args.compat)
    activation.set_doctor(run)
    import tfamp_rewrite_startup

    tfamp_rewrite_startup.activate_when_tensorflow_loads()
    error = None
    try:
        run_program(args.module, args.program)
    except doctor_state.StopDoctor:
        pass
    except SystemExit as stop:
        if stop.code not in (None, 0):
            error = "it exited with status %s" % (stop.code,)
    except Exception as failure:  # the program's own error: reported, with its traceback
        traceback.print_exc()
        error = "it raised %s: %s" % (type(failure).__name__, " ".join(str(failure).split())[:300])
    activation.set_doctor(None)
    notes = []
    if error is None and len(run.accumulator.steps) < run.steps:
        notes.append("the program ended after %d of the %d step(s) asked for" % (
            len(run.accumulator.steps), run.steps))
    report = run.report(notes)
    with open(args.json, "w") as handle:
        json.dump({"report": json_safe(report.to_dict()), "error": error}, handle)
    return FAILED if error else 0


if __name__ == "__main__":
    sys.exit(main())

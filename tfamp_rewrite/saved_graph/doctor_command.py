"""``tfamp-rewrite doctor``: run a training program for a few steps and say what half would break.

    tfamp-rewrite doctor [--steps N] [--dtype D] [--report FILE.json] [--plot FILE.png] train.py [ARGS...]

The program runs in a child process (``python -m tfamp_rewrite.training.doctor_run``),
as ``tfamp-run`` would run it but with float32 sessions that probe every tensor the
rewrite would hold in half (the training capability's doctor; this command line only
starts it, so the converter's process never switches TensorFlow's sessions).  The
child's output is the program's own.  Then this prints the doctor's summary and writes
``--report`` (``report_schema.DOCTOR_SCHEMA``) and ``--plot`` (the gradient histogram),
each atomically, and only once both are ready.  A program that fails, or is not found,
is one line on stderr, exit status 2, nothing written.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from ..errors import ConversionError

CHILD = "tfamp_rewrite.training.doctor_run"


def add_doctor_parser(commands) -> None:
    parser = commands.add_parser(
        "doctor", help="run a training program for N steps; report what overflows or underflows in half",
        description="Run a TF1 training program for a few steps through the same activation as tfamp-run, "
        "with float32 sessions that measure every tensor the mixed-precision rewrite would hold in half; "
        "report the tensors that would overflow or flush to zero (with the list edit that keeps each "
        "float32), the gradients' underflow without loss scaling and at the current and recommended "
        "scale, the recommended initial loss scale and whether dynamic scaling is needed.",
        epilog="Exit status: 0 reported, 2 the program failed or bad arguments (nothing written).")
    parser.add_argument("--steps", type=int, default=20, metavar="N",
                        help="training steps to probe (default 20); then the program is stopped")
    parser.add_argument("--plain-steps", type=int, default=3, metavar="K",
                        help="steps run unprobed after them, timed, to say what probing costs (default 3)")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    parser.add_argument("--target", choices=("gpu", "cpu"),
                        help="whose nodes the rewrite would convert (default: cpu if "
                        "TFAMP_REWRITE_TARGET=cpu, else gpu)")
    parser.add_argument("--compat", choices=("auto", "latest", "tf2.15", "tf1.15"),
                        help="whose AMP pass the rewrite follows (default: $TFAMP_REWRITE_COMPAT or "
                        "auto: the installed TensorFlow's, as sessions do)")
    parser.add_argument("--margin", type=int, default=3, metavar="BITS",
                        help="powers of two of headroom the recommended loss scale keeps (default 3: 8x)")
    parser.add_argument("--report", metavar="FILE.json", help="write the report as JSON")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw the histogram of gradient magnitudes, unscaled and at the recommended "
                        "scale")
    parser.add_argument("-m", dest="module", help="run a module, as python -m does")
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="the script and its arguments (or the module's arguments with -m)")
    parser.set_defaults(run=run_doctor)


def run_doctor(args) -> int:
    from .writer import check_writable_directory, write_file_atomically

    _check_arguments(args)
    for option in ("report", "plot"):
        if getattr(args, option):
            check_writable_directory(getattr(args, option), "--" + option)
    report = _run_child(args)
    outputs = []
    if args.report:
        text = json.dumps(report.to_dict(), indent=1, sort_keys=True, allow_nan=False)
        outputs.append((args.report, (text + "\n").encode("utf-8")))
    if args.plot:
        outputs.append((args.plot, _plot(report, args)))
    print(report.summary())
    for path, data in outputs:
        write_file_atomically(path, data)
        print("wrote %s" % path)
    return 0


def _check_arguments(args) -> None:
    if not args.module and not args.program:
        raise ConversionError("doctor needs a program to run",
                              "Name a script: tfamp-rewrite doctor train.py [ARGS]")
    if args.steps < 1 or args.plain_steps < 0:
        raise ConversionError("--steps must be 1 or more and --plain-steps 0 or more", "Pass e.g. --steps 20")
    if not args.module and not os.path.isfile(args.program[0]):
        raise ConversionError("%s: no such file" % args.program[0], "Pass a Python script, or -m module")
    if args.plot and not args.plot.lower().endswith(".png"):
        raise ConversionError("--plot %s does not end in .png" % args.plot, "Name the picture FILE.png")


def _run_child(args):
    from ..doctor.report import DoctorReport

    target = args.target or ("cpu" if os.environ.get("TFAMP_REWRITE_TARGET", "").strip().lower() == "cpu"
                             else "gpu")
    with tempfile.TemporaryDirectory(prefix="tfamp-doctor-") as directory:
        result = os.path.join(directory, "report.json")
        command = [sys.executable, "-m", CHILD, "--json", result, "--steps", str(args.steps),
                   "--plain-steps", str(args.plain_steps), "--dtype", args.dtype, "--target", target,
                   "--margin", str(args.margin)] + (["--compat", args.compat] if args.compat else [])
        command += (["-m", args.module] if args.module else []) + list(args.program)
        sys.stdout.flush()
        status = subprocess.call(command)
        what = args.module or args.program[0]
        try:
            with open(result) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            raise ConversionError("%s did not run to its first step under the doctor (exit status %d); its "
                                  "output is above" % (what, status), "Fix it so that it runs with python "
                                  "first") from None
    if data.get("error") or status != 0:
        failure = data.get("error") or "exit status %d" % status
        raise ConversionError("%s failed under the doctor: %s" % (what, failure),
                              "Its output is above; fix it so that it runs with python first")
    return DoctorReport.from_dict(data["report"])


def _plot(report, args) -> bytes:
    from ..doctor.plot import gradient_histogram_png

    try:
        return gradient_histogram_png(report, "%s: gradients held in %s over %d step(s)" % (
            args.module or args.program[0], report.dtype, report.steps))
    except ValueError as error:
        raise ConversionError("--plot: %s (the program computed no gradient in half)" % error,
                              "Drop --plot, or probe steps that train") from None
    except ImportError as error:
        raise ConversionError("--plot needs matplotlib (%s)" % error, "pip install matplotlib") from None

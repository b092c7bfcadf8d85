"""``tfamp-run``: run a TF1 program in mixed precision without changing its code.

    tfamp-run [--no-loss-scaling] [--target auto|gpu|cpu] [--dtype float16|bfloat16]
              [--numerics native|emulate] [--compat auto|latest|tf2.15|tf1.15] train.py [ARGS...]
    tfamp-run [...] -m package.module [ARGS...]
    python -m tfamp_rewrite.training.run [...] train.py [ARGS...]

Sets ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` (for this process and the processes it starts;
already-set NVIDIA variables are kept and decide), arranges for the graph rewrite and
automatic loss scaling to switch on when the program imports TensorFlow (as the start-up
hook does, so TensorFlow is imported when the program does it, after whatever environment
it sets up first), and runs the program as ``__main__`` with its own arguments, as
``python`` would.  A variable that is not a boolean is one line on stderr, exit status 2.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys


def _parser():
    parser = argparse.ArgumentParser(
        prog="tfamp-run", description="Run a TF1 program with automatic mixed precision.")
    parser.add_argument("--no-loss-scaling", action="store_true",
                        help="rewrite the graph but do not add loss scaling to optimizers")
    parser.add_argument("--target", choices=("auto", "gpu", "cpu"),
                        help="rewrite target for sessions (default: $TFAMP_REWRITE_TARGET or auto: "
                             "GPUs of compute capability >= 7.0 only)")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"),
                        help="low-precision type for sessions (default: $TFAMP_REWRITE_DTYPE or float16)")
    parser.add_argument("--numerics", choices=("native", "emulate"),
                        help="how half nodes run (default: $TFAMP_REWRITE_NUMERICS or native: half "
                             "kernels; emulate: float32 kernels on values rounded to half, as a "
                             "Tensor Core GPU computes)")
    parser.add_argument("--compat", choices=("auto", "latest", "tf2.15", "tf1.15"),
                        help="whose AMP pass sessions follow (default: $TFAMP_REWRITE_COMPAT or "
                             "auto: the running TensorFlow's)")
    parser.add_argument("-m", dest="module", help="run a module, as python -m does")
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="the script and its arguments (or the module's arguments with -m)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not args.module and not args.program:
        _parser().error("name a script to run (tfamp-run train.py ...) or a module (-m name)")
    os.environ.setdefault("TF_ENABLE_AUTO_MIXED_PRECISION", "1")
    if args.no_loss_scaling:
        os.environ["TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING"] = "0"
    if args.target:
        os.environ["TFAMP_REWRITE_TARGET"] = args.target
    for value, name in ((args.dtype, "TFAMP_REWRITE_DTYPE"), (args.numerics, "TFAMP_REWRITE_NUMERICS"),
                        (args.compat, "TFAMP_REWRITE_COMPAT")):
        if value:
            os.environ[name] = value
    from . import activation

    try:
        activation.graph_rewrite_requested()
        activation.loss_scaling_requested()
    except ValueError as error:
        print("tfamp-run: %s" % error, file=sys.stderr)
        return 2
    import tfamp_rewrite_startup

    tfamp_rewrite_startup.activate_when_tensorflow_loads()
    if not args.module and not os.path.isfile(args.program[0]):
        print("tfamp-run: %s: no such file; pass a Python script (or -m module)" % args.program[0],
              file=sys.stderr)
        return 2
    run_program(args.module, args.program)
    return 0


def run_program(module, program) -> None:
    """Runs ``module`` (with ``program`` as its arguments) or the script ``program[0]`` as
    ``__main__``, with ``sys.argv`` and ``sys.path`` as ``python`` would set them."""
    if module:
        sys.argv = [module] + list(program)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script = program[0]
        sys.argv = list(program)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    sys.exit(main())

"""``tfamp-rewrite``: convert saved graphs to mixed precision, explain the decisions, and doctor
training programs.

Argument parsing and the convert / explain commands only (``doctor``: ``doctor_command``);
the work is done by ``conversion`` (rewrite, constants, keep-io-types, Tensor Cores),
``tuning`` (calibration, auto-tuning), ``formats`` / ``writer`` (files), ``validate``,
``explain`` and ``dot``.  ``main(argv) -> exit status``:

* 0: done (``convert``: OUTPUT written; ``explain``, ``doctor``: printed);
* 1: ``--validate`` found outputs beyond ``--rtol``/``--atol`` (OUTPUT not written);
* 2: a problem with the command: one line on stderr naming it and the fix, nothing
  written (``ConversionError``, or an argument error) -- and, as a last resort, any other
  exception: one line saying it is an internal error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import List, Optional

from ..errors import ConversionError

PROG = "tfamp-rewrite"
_LIST_ENV = ("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_{ALLOW,INFER,DENY,CLEAR}LIST_{ADD,REMOVE} "
             "(comma-separated op types) edit the op lists, as in TensorFlow")


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line on stderr, exit status 2."""

    def error(self, message):
        self.exit(2, "%s: %s. See %s --help\n" % (self.prog, message, self.prog))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Automatic mixed precision for saved TensorFlow 1.x graphs: "
                     "convert frozen GraphDefs, MetaGraphs and SavedModels to float16/bfloat16 with "
                     "TensorFlow's AMP rules, and explain every decision.",
                     epilog="Environment: " + _LIST_ENV + ".")
    from .. import __version__

    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    convert_parser = commands.add_parser(
        "convert", help="convert INPUT to OUTPUT (same format)",
        description="Convert a saved graph to mixed precision with the same pass as the runtime "
        "rewrite. INPUT is a frozen GraphDef (.pb binary, .pbtxt text), a MetaGraph (.meta) or a "
        "SavedModel directory; OUTPUT is written in the same format, atomically.",
        epilog="Exit status: 0 converted, 1 validation beyond tolerance (OUTPUT not written; "
        "--report and --dot are, with the comparison), 2 bad input or arguments (nothing "
        "written). Environment: " + _LIST_ENV + ".")
    convert_parser.add_argument("input", metavar="INPUT", help="frozen .pb/.pbtxt, .meta or SavedModel dir")
    convert_parser.add_argument("output", metavar="OUTPUT", help="where to write the converted graph")
    _add_graph_options(convert_parser)
    _add_rewrite_options(convert_parser)
    _add_report_options(convert_parser)
    group = convert_parser.add_argument_group("validation")
    group.add_argument("--validate", action="store_true",
                       help="run original and converted graph on the same inputs; print max abs/rel "
                       "error and top-1 agreement; fail (exit 1, OUTPUT not written) beyond --rtol/--atol")
    group.add_argument("--input-data", metavar="FILE.npz",
                       help="inputs for --validate, one array per input (signature key, tensor or "
                       "node name); default: random with --seed")
    group.add_argument("--numerics", choices=("auto", "emulate", "native"), default="auto",
                       help="how --validate runs the converted graph's half nodes: emulate (float32 "
                       "kernels on values rounded to half, what a Tensor Core GPU computes, on any "
                       "CPU), native (this machine's half kernels), auto (default: native on a GPU, "
                       "else emulate). OUTPUT is the same either way")
    group.add_argument("--rtol", type=float, help="relative tolerance (default: emulated 1e-2 for "
                       "float16, 1e-1 for bfloat16; native 5e-2 and 1e-1, as a CPU's half kernels "
                       "may accumulate in half)")
    group.add_argument("--atol", type=float, help="absolute tolerance (default as --rtol)")
    group.add_argument("--batch-size", type=int, default=4, metavar="N",
                       help="size of unknown input dimensions for random inputs (default 4)")
    group.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    group = convert_parser.add_argument_group("precision by data")
    group.add_argument("--calibration-data", metavar="FILE.npz",
                       help="run the original graph on these inputs (one array per input, split along the "
                       "first axis into batches of a fixed first dimension) and keep in float32 every node "
                       "whose observed values would overflow or mostly flush to zero in half")
    group.add_argument("--overflow-threshold", type=float, metavar="F",
                       help="share of a tensor's values beyond the largest half value that keeps it float32 "
                       "(default 0: any)")
    group.add_argument("--flush-threshold", type=float, metavar="F",
                       help="share of a tensor's non-zero values below the smallest half subnormal that "
                       "keeps it float32 (default 0.5)")
    group.add_argument("--auto-tune", action="store_true",
                       help="find a small set of nodes to keep in float32 so that --validate passes (implies "
                       "--validate): the range-based set, then bisection over the remaining half nodes in "
                       "topological blocks; each node kept is reported with why")
    group.add_argument("--max-trials", type=int, default=64, metavar="N",
                       help="--auto-tune: at most N validations (default 64)")
    group = convert_parser.add_argument_group("output")
    group.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    group.add_argument("--force", action="store_true", help="convert even if INPUT is already converted")
    group.add_argument("-q", "--quiet", action="store_true",
                       help="print only the line saying what was written")
    convert_parser.set_defaults(run=_run_convert)

    explain_parser = commands.add_parser(
        "explain", help="print the pass summary and why nodes get their dtypes",
        description="Run the conversion in memory and print the pass summary (NVIDIA's fields, counts "
        "per op type, Tensor Core diagnostics, constants) and, with --node, the chain of reasons "
        "behind that node's dtype. Nothing is written except --report/--dot.",
        epilog="Environment: " + _LIST_ENV + ".")
    explain_parser.add_argument("input", metavar="INPUT", help="frozen .pb/.pbtxt, .meta or SavedModel dir")
    explain_parser.add_argument("--all-nodes", action="store_true",
                                help="also print one line per node: name, op, dtype, reason")
    _add_graph_options(explain_parser)
    _add_rewrite_options(explain_parser)
    _add_report_options(explain_parser)
    explain_parser.set_defaults(run=_run_explain, force=True)
    from .doctor_command import add_doctor_parser

    add_doctor_parser(commands)
    return parser


def _add_graph_options(parser) -> None:
    group = parser.add_argument_group("graph")
    group.add_argument("--tag-set", metavar="TAGS", help="SavedModel MetaGraph to convert, e.g. "
                       "'serve' or 'serve,gpu' (default: the only one, else 'serve')")
    group.add_argument("--signature-def", metavar="KEY", help="signature whose inputs/outputs are "
                       "validated (default serving_default); every signature keeps its dtypes")
    group.add_argument("--inputs", action="append", default=[], metavar="NAMES",
                       help="frozen graph / MetaGraph inputs, comma-separated or repeated "
                       "(default: the Placeholders)")
    group.add_argument("--outputs", action="append", default=[], metavar="NAMES",
                       help="frozen graph / MetaGraph outputs, comma-separated or repeated "
                       "(default: the nodes nothing consumes)")


def _add_rewrite_options(parser) -> None:
    group = parser.add_argument_group("rewrite")
    group.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                       help="half type (default float16)")
    group.add_argument("--target", choices=("gpu", "cpu"), default="gpu",
                       help="device whose nodes are converted, and whose kernels are required "
                       "(default gpu)")
    group.add_argument("--compat", choices=("auto", "latest", "tf2.15", "tf1.15"), default="auto",
                       help="whose op lists and rules: the installed TensorFlow's (auto, the default), "
                       "the newest TensorFlow's, 2.15's or 1.15's (tf1.15 also leaves default-valued "
                       "attributes out, so TensorFlow 1.15 reads graphs a newer TensorFlow wrote)")
    group.add_argument("--keep-io-types", dest="keep_io_types", action="store_true", default=True,
                       help="graph inputs/outputs and signatures keep float32, with Casts at the "
                       "boundary (default)")
    group.add_argument("--no-keep-io-types", dest="keep_io_types", action="store_false",
                       help="inputs feeding only half ops become half; outputs keep the dtype the "
                       "pass gives them; signatures follow")
    group.add_argument("--op-types-to-exclude", action="append", default=[], metavar="OPS",
                       help="op types left exactly as they are (comma-separated or repeated)")
    group.add_argument("--op-types-to-include", action="append", default=[], metavar="OPS",
                       help="op types added to the allow list (always converted)")
    group.add_argument("--nodes-to-exclude", action="append", default=[], metavar="REGEX",
                       help="nodes whose names match REGEX from the start are left as they are (repeatable)")
    group.add_argument("--out-of-range", choices=("keep-float32", "clamp"), default="keep-float32",
                       help="constants whose values do not fit the half type: keep the ops reading them "
                       "in float32 (default), or clamp them into range with a warning")


def _add_report_options(parser) -> None:
    group = parser.add_argument_group("report")
    group.add_argument("--report", metavar="FILE.json", help="write the full report as JSON")
    group.add_argument("--dot", metavar="FILE", help="write the converted graph (or --node's neighbourhood) "
                       "as Graphviz DOT, and FILE.png when Graphviz's dot is installed")
    group.add_argument("--node", metavar="NAME", help="explain: the node whose reason chain is printed; "
                       "--dot: draw only its neighbourhood")
    group.add_argument("--radius", type=int, default=2, metavar="N",
                       help="--dot --node: edges around NAME to draw (default 2)")


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line; returns the exit status (see module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    try:
        _import_tensorflow_quietly()
        return args.run(args)
    except ConversionError as error:
        sys.stderr.write("%s: %s\n" % (PROG, " ".join(str(error).splitlines())))
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("%s: interrupted; nothing was written\n" % PROG)
        return 130
    except Exception as error:  # a bug of ours: still one line and status 2, never a traceback
        detail = " ".join(str(error).split())[:200]
        what = type(error).__name__ + (": " + detail if detail else "")
        sys.stderr.write("%s: internal error (%s); nothing was written. Please report it with the input "
                         "and this command line\n" % (PROG, what))
        return 2


def _import_tensorflow_quietly() -> None:
    """Imports TensorFlow with its start-up chatter on stderr held back (shown if it fails).

    TensorFlow's C++ logging writes to file descriptor 2 while it loads (oneDNN notices,
    absl's pre-initialisation warning) whatever TF_CPP_MIN_LOG_LEVEL says; the command
    line promises one line on stderr per problem.
    """
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    with tempfile.TemporaryFile() as chatter:
        os.dup2(chatter.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except BaseException:
            os.dup2(saved_stderr, 2)
            chatter.seek(0)
            sys.stderr.write(chatter.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)


def _options(args):
    from ..graph_rewrite.compat import resolve_compat
    from .conversion import ConvertOptions

    return ConvertOptions(
        dtype=args.dtype, target=args.target, compat=resolve_compat(args.compat, args.dtype),
        keep_io_types=args.keep_io_types,
        inputs=_names(args.inputs), outputs=_names(args.outputs), signature=args.signature_def,
        op_types_to_exclude=_names(args.op_types_to_exclude),
        op_types_to_include=_names(args.op_types_to_include), nodes_to_exclude=list(args.nodes_to_exclude),
        out_of_range=args.out_of_range, force=args.force)


def _names(values: List[str]) -> List[str]:
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _check_side_outputs(args, saved) -> None:
    """--report and --dot (and the PNG beside a .dot) write where nothing else is read or
    written: not over the input, OUTPUT or each other."""
    from .dot import side_paths
    from .writer import check_side_output

    output = getattr(args, "output", None)  # explain writes no OUTPUT
    taken = {output: "OUTPUT"} if output else {}
    for role, paths in (("--report", [args.report] if args.report else []),
                        ("--dot", side_paths(args.dot) if args.dot else [])):
        for path in paths:
            check_side_output(path, role, saved, taken)
            taken[path] = role
    if args.radius < 0:
        raise ConversionError("--radius %d is negative" % args.radius, "Pass 0 or more")


def _check_tuning_options(args) -> None:
    if args.auto_tune:
        args.validate = True
    if args.input_data and not args.validate:
        raise ConversionError("--input-data is only used by --validate",
                              "Add --validate, or drop --input-data")
    measured = args.calibration_data or args.auto_tune
    for option, value, low, high in (("--overflow-threshold", args.overflow_threshold, 0.0, 1.0),
                                     ("--flush-threshold", args.flush_threshold, 0.0, 1.0)):
        if value is not None and not measured:
            raise ConversionError("%s is only used with --calibration-data or --auto-tune" % option,
                                  "Add --calibration-data FILE.npz or --auto-tune, or drop %s" % option)
        if value is not None and not low <= value < high:
            raise ConversionError("%s %g is not a share in [0, 1)" % (option, value), "Pass e.g. 0.5")
    if args.max_trials < 1:
        raise ConversionError("--max-trials %d is below 1" % args.max_trials, "Pass 1 or more")


def _run_convert(args) -> int:
    from .conversion import prepare
    from .formats import read_saved_graph
    from .graph_io import update_signatures
    from .tuning import ConversionChecker, tuned_conversion
    from .writer import check_output, stage_output

    _check_tuning_options(args)
    if args.node and not args.dot:
        raise ConversionError("convert uses --node only to draw its neighbourhood with --dot",
                              "Add --dot FILE; for its reasons run: tfamp-rewrite explain INPUT --node NAME")
    saved = read_saved_graph(args.input, args.tag_set)
    check_output(saved, args.output, args.overwrite)
    _check_side_outputs(args, saved)
    options = _options(args)
    prepared = prepare(saved, options)
    checker = None
    if args.validate:
        checker = ConversionChecker(saved, prepared.io, args.dtype, args.output, args.numerics,
                                    args.rtol, args.atol, args.input_data, args.batch_size, args.seed)
    conversion = tuned_conversion(
        saved, options, prepared, checker, args.calibration_data, args.auto_tune,
        0.0 if args.overflow_threshold is None else args.overflow_threshold,
        0.5 if args.flush_threshold is None else args.flush_threshold, args.max_trials)
    report = conversion.report
    staged = stage_output(saved, conversion.graph_def, args.output,
                          lambda meta: update_signatures(meta, conversion.graph_def),
                          stripped_default_attrs=options.compat == "tf1.15")
    try:
        if checker is not None:
            report.validation = checker.check(conversion, staged.temporary)
        if report.validation is not None and not report.validation.passed:
            staged.discard()
        else:
            staged.commit()
            report.output = args.output
            report.output_bytes = _size(args.output)
    except BaseException:
        staged.discard()
        raise
    _write_side_outputs(args, conversion)
    if not args.quiet or report.output is None:
        print(report.summary())
    if report.output is None:
        reshaped = [out for out in report.validation.outputs if out.shapes]
        if reshaped:
            why = ("output %r changed shape (%s), which no tolerance covers"
                   % (reshaped[0].name, reshaped[0].shapes))
            fixes = "Keep"
        else:
            why = "outputs differ beyond rtol=%g, atol=%g" % (report.validation.rtol,
                                                               report.validation.atol)
            fixes = "Loosen --rtol/--atol, keep"
        sys.stderr.write("%s: validation failed: %s, so %s was not written. %s ops in float32 "
                         "with --op-types-to-exclude or --nodes-to-exclude, or let --auto-tune find "
                         "them\n" % (PROG, why, args.output, fixes))
        return 1
    print("wrote %s: %s, %.1f MB (%.2fx the input's %.1f MB), converted in %.2f s" % (
        args.output, saved.describe(output=args.output), report.output_bytes / 1e6,
        report.output_bytes / max(report.input_bytes, 1), report.input_bytes / 1e6, report.seconds))
    return 0


def _size(path: str) -> int:
    from .formats import directory_size

    return directory_size(path) if os.path.isdir(path) else os.path.getsize(path)


def _run_explain(args) -> int:
    from .conversion import convert
    from .explain import format_chain, format_decisions, reason_chain
    from .formats import read_saved_graph

    saved = read_saved_graph(args.input, args.tag_set)
    _check_side_outputs(args, saved)
    conversion = convert(saved, _options(args))
    chain = reason_chain(conversion.report.rewrite, args.node) if args.node else None
    _write_side_outputs(args, conversion)
    print(conversion.report.summary())
    if args.all_nodes:
        print(format_decisions(conversion.report.rewrite))
    if chain is not None:
        print(format_chain(chain))
    return 0


def _write_side_outputs(args, conversion) -> None:
    from ..graph_rewrite.report import json_safe
    from .writer import write_file_atomically

    if args.report:
        text = json.dumps(json_safe(conversion.report.to_dict()), indent=1, sort_keys=True)
        write_file_atomically(args.report, (text + "\n").encode("utf-8"))
    if args.dot:
        from .dot import graph_to_dot, write_dot

        write_dot(graph_to_dot(conversion.graph_def, conversion.report.rewrite, args.node, args.radius),
                  args.dot)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

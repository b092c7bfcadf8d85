"""Converting a saved graph: the steps between reading a file and writing one.

``convert(saved, options) -> Conversion`` works in memory (nothing is written)::

    refuse an invalid graph                  # input_check: OpDefs, TensorFlow's importer, variables
    refuse a graph that is already converted (unless options.force)
    io       = resolve_io(saved, ...)        # inputs, outputs, signature, Saver/init nodes
    excluded = nodes matching --nodes-to-exclude
    excluded += nodes the training run that saved a SavedModel / MetaGraph healed (its heal
                file beside the checkpoint, doctor/heal_files.py)
    excluded += nodes calibration / auto-tuning keep float32 (tuning.py), with their reasons
    repeat:                                  # at most a few rounds
        result = rewrite_graph_def(graph, fetches=outputs, feeds=inputs (keep-io-types),
                                   op_types_to_exclude, nodes_to_exclude=excluded,
                                   lists={"allow_add": --op-types-to-include, ...})
        if --out-of-range keep-float32 and half Casts read constants that do not fit:
            excluded += their readers; again
    fold Cast(Const) into half constants     # constants.fold_constants
    without keep-io-types: release float32 inputs that only feed half Casts (unless excluded)
    Tensor Core diagnostics -> result.report.tensor_cores

``ConversionReport`` is what ``--report`` writes: the options, the inputs and outputs
with their dtypes before and after, sizes, time, the rewrite's report (with Tensor
Cores), the constants report and, with ``--validate``, the validation report.
"""
from __future__ import annotations

import copy
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from ..doctor.heal_files import beside_checkpoint, heal_file_exists, kept_in
from ..errors import ConversionError, GraphRewriteError
from ..graph_rewrite.op_lists import builtin_lists, close_op_types
from ..graph_rewrite.report import RewriteReport
from ..graph_rewrite.rewrite import RewriteResult, rewrite_graph_def
from ..graph_rewrite.tensor_cores import diagnose
from .constants import ConstantRange, exclusions_for_out_of_range, fold_constants
from .formats import METAGRAPH, SAVEDMODEL, SavedGraph
from .graph_io import GraphIO, GraphTensor, record_converted_dtypes, release_inputs, resolve_io
from .input_check import check_input

_MAX_ROUNDS = 8
_HALF_ENUMS = frozenset({19, 14})
_AMP_SUFFIX = "AutoMixedPrecision"


@dataclass
class ConvertOptions:
    """What the command line asks for (defaults = ``tfamp-rewrite convert`` without flags)."""

    dtype: str = "float16"
    target: str = "gpu"
    compat: str = "auto"                     # resolved by the command line (graph_rewrite/compat.py)
    keep_io_types: bool = True
    inputs: Sequence[str] = ()
    outputs: Sequence[str] = ()
    signature: Optional[str] = None
    op_types_to_exclude: Sequence[str] = ()
    op_types_to_include: Sequence[str] = ()
    nodes_to_exclude: Sequence[str] = ()     # regular expressions, matched from the start
    out_of_range: str = "keep-float32"
    force: bool = False


@dataclass
class ConversionReport:
    """Everything one conversion decided and measured (``--report`` writes ``to_dict()``)."""

    input: str
    input_format: str
    output: Optional[str]
    dtype: str
    target: str
    keep_io_types: bool
    out_of_range: str
    signature: Optional[str]
    inputs: List[GraphTensor]
    outputs: List[GraphTensor]
    excluded_nodes: List[str]
    excluded_op_types: List[str]
    included_op_types: List[str]
    rewrite: RewriteReport
    constants: object                      # constants.ConstantReport
    input_bytes: int = 0
    output_bytes: Optional[int] = None
    seconds: float = 0.0
    validation: Optional[object] = None    # validate.ValidationReport
    warnings: List[str] = field(default_factory=list)
    calibration: Optional[object] = None   # calibration.CalibrationReport (--calibration-data)
    auto_tune: Optional[object] = None     # auto_tune.AutoTuneReport (--auto-tune)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """The pass summary (with Tensor Cores), constants, I/O dtypes, warnings, validation."""
        lines = [self.rewrite.summary()]
        lines.extend(self.constants.summary_lines())
        signature = ", signature %s" % self.signature if self.signature else ""
        lines.append("Inputs and outputs (keep-io-types %s%s):" % (
            "on" if self.keep_io_types else "off", signature))
        for role, tensors in (("input", self.inputs), ("output", self.outputs)):
            lines.extend("  %-6s %-32s %s -> %s" % (role, tensor.key, tensor.dtype, tensor.converted_dtype)
                         for tensor in tensors)
        lines.extend("warning: " + text for text in self.warnings)
        if self.calibration is not None:
            lines.extend(self.calibration.summary_lines())
        if self.auto_tune is not None:
            lines.extend(self.auto_tune.summary_lines())
        if self.validation is not None:
            lines.extend(self.validation.summary_lines())
        return "\n".join(lines)


@dataclass
class Conversion:
    """The converted graph (not yet written) and its report."""

    saved: SavedGraph
    io: GraphIO
    graph_def: object
    report: ConversionReport
    rewritten: object = None   # the pass's own output (before constants are folded)


@dataclass
class Prepared:
    """What every conversion of one input shares: its checks' warnings, I/O and exclusions."""

    io: GraphIO
    excluded: List[str]
    warnings: List[str]
    seconds: float
    healed: Dict[str, str] = field(default_factory=dict)  # node its training run healed -> heal file


def prepare(saved: SavedGraph, options: ConvertOptions) -> Prepared:
    """Checks ``saved`` and resolves its inputs, outputs and ``--nodes-to-exclude``."""
    start = time.perf_counter()
    warnings = check_input(saved, options.op_types_to_exclude)
    if not options.force:
        refuse_converted(saved, options.dtype)
    io = resolve_io(saved, options.inputs, options.outputs, options.signature)
    warnings += _unused_options(saved.graph_def, options)
    excluded = matching_nodes(saved.graph_def, options.nodes_to_exclude)
    healed = healed_in_training(saved)
    excluded += [name for name in healed if name not in excluded]
    return Prepared(io, excluded, warnings, time.perf_counter() - start, healed)


def healed_in_training(saved: SavedGraph) -> Dict[str, str]:
    """``{node: heal file}`` for the nodes of ``saved`` that the training run saving its
    checkpoint kept float32: the heal file in a SavedModel's ``variables/`` or beside a
    MetaGraph.  A file that cannot be read is an error naming it."""
    if saved.kind == SAVEDMODEL:
        path = beside_checkpoint(os.path.join(saved.path, "variables", "variables"))
    elif saved.kind == METAGRAPH:
        path = beside_checkpoint(saved.graph_file)
    else:
        return {}
    if not heal_file_exists(path):
        return {}
    try:
        listed = set(kept_in(path))
    except ValueError as error:
        raise ConversionError("%s cannot be read as the nodes its training run kept float32 (%s)"
                              % (path, error), "Delete it to convert those nodes, or restore it "
                              "from the training run's checkpoint directory") from None
    return {node.name: path for node in saved.graph_def.node if node.name in listed}


def convert(saved: SavedGraph, options: ConvertOptions, prepared: Optional[Prepared] = None,
            kept: Optional[Dict[str, object]] = None) -> Conversion:
    """Converts ``saved.graph_def`` in memory (see module docstring).

    ``kept``: ``{node: calibration.KeptNode}`` -- nodes excluded because calibration or
    auto-tuning found they must stay float32 (their decisions say why).
    """
    start = time.perf_counter()
    prepared = prepared or prepare(saved, options)
    io, warnings = copy.deepcopy(prepared.io), list(prepared.warnings)
    excluded = list(prepared.excluded) + [name for name in (kept or {}) if name not in prepared.excluded]
    result, out_of_range, kept_constants = _rewrite(saved, io, options, excluded)
    graph_def = result.graph_def
    report = result.report
    preserved = set(io.boundary_inputs) | set(io.boundary_outputs) | set(io.kept)
    constants = fold_constants(graph_def, report.casts, options.dtype, options.out_of_range, preserved)
    constants.out_of_range.extend(kept_constants)
    if constants.folded:
        report.notes.append("%d constant(s) folded into %s; the counts above include their Casts" % (
            constants.folded, options.dtype))
    _explain_boundaries(report, io, options.keep_io_types)
    _explain_kept(report, kept or {})
    _explain_healed(report, prepared.healed)
    _explain_out_of_range(report, out_of_range)
    _explain_folded(report, constants)
    if not options.keep_io_types:
        left_alone = set(excluded) | {node.name for node in saved.graph_def.node
                                      if node.op in options.op_types_to_exclude}
        inputs = [tensor for tensor in io.inputs if tensor.tensor.partition(":")[0] not in left_alone]
        released = release_inputs(graph_def, inputs, report.casts)
        if released:
            report.notes.append("inputs now %s (no keep-io-types): %s" % (options.dtype, ", ".join(released)))
    record_converted_dtypes(io, graph_def)
    report.tensor_cores = diagnose(saved.graph_def, report)
    conversion_report = ConversionReport(
        input=saved.path, input_format=saved.describe(), output=None, dtype=options.dtype,
        target=options.target, keep_io_types=options.keep_io_types, out_of_range=options.out_of_range,
        signature=io.signature, inputs=io.inputs, outputs=io.outputs, excluded_nodes=sorted(excluded),
        excluded_op_types=list(options.op_types_to_exclude),
        included_op_types=list(options.op_types_to_include), rewrite=report, constants=constants,
        input_bytes=saved.size, warnings=warnings)
    conversion_report.seconds = time.perf_counter() - start + prepared.seconds
    return Conversion(saved, io, graph_def, conversion_report, result.graph_def)


def _rewrite(saved: SavedGraph, io: GraphIO, options: ConvertOptions, excluded: List[str]):
    """Runs the pass, again with readers of out-of-range constants excluded (keep-float32)."""
    lists = None
    if options.op_types_to_include:
        include = list(options.op_types_to_include)
        lists = {"allow_add": include, "infer_remove": include, "deny_remove": include,
                 "clear_remove": include}
    fetches = list(io.kept) + (list(io.boundary_outputs) if options.keep_io_types else [])
    feeds = list(io.boundary_inputs) if options.keep_io_types else []
    out_of_range: Dict[str, str] = {}  # excluded reader -> the constant it reads
    issues: Dict[str, ConstantRange] = {}
    for _ in range(_MAX_ROUNDS):
        try:
            result: RewriteResult = rewrite_graph_def(
                saved.graph_def, fetches=fetches, feeds=feeds, dtype=options.dtype, target=options.target,
                compat=options.compat, lists=lists, op_types_to_exclude=options.op_types_to_exclude,
                nodes_to_exclude=list(excluded) + list(out_of_range))
        except GraphRewriteError as error:
            raise ConversionError("%s cannot be rewritten: %s" % (saved.path, error),
                                  "Re-export the graph; it is malformed") from None
        except ValueError as error:
            raise ConversionError(str(error), "See tfamp-rewrite convert --help") from None
        if options.out_of_range != "keep-float32":
            break
        more, found = exclusions_for_out_of_range(result.graph_def, result.report.casts, options.dtype)
        more = {name: const for name, const in more.items() if name not in out_of_range}
        if not more:
            break
        out_of_range.update(more)
        for issue in found:
            issues.setdefault(issue.name, issue)
    for issue in issues.values():
        issue.consumers = sorted(name for name, const in out_of_range.items() if const == issue.name)
        issue.action = "kept float32: its readers are excluded from the rewrite"
    return result, out_of_range, list(issues.values())


def _explain_boundaries(report: RewriteReport, io: GraphIO, keep_io_types: bool) -> None:
    """The pass says 'preserved: fetch'; say which role the node plays in the saved graph."""
    roles = dict.fromkeys(io.kept, "a node the saved graph's Saver or initialisation needs")
    if keep_io_types:
        roles.update(dict.fromkeys(io.boundary_inputs, "a graph input (keep-io-types)"))
        roles.update(dict.fromkeys(io.boundary_outputs, "a graph output (keep-io-types)"))
    for decision in report.decisions:
        if decision.name in roles and decision.reason in ("preserved: fetch", "preserved: feed"):
            decision.reason = "preserved: %s" % roles[decision.name]


def _explain_kept(report: RewriteReport, kept: Dict[str, object]) -> None:
    """Nodes calibration or auto-tuning kept float32 get its reason."""
    for decision in report.decisions:
        node = kept.get(decision.name)
        if node is not None:
            label = "calibration" if node.rule == "calibration" else "auto-tune"
            decision.reason = "kept float32 by %s: %s" % (label, node.reason)
            decision.rule = node.rule


def _explain_healed(report: RewriteReport, healed: Dict[str, str]) -> None:
    """Nodes the training run healed get that reason, and the report says where it is kept."""
    for decision in report.decisions:
        path = healed.get(decision.name)
        if path is not None and "excluded by name" in decision.reason:
            decision.reason = "kept float32: the training run that saved this model healed it (%s)" % path
            decision.rule = "healed_in_training"
    if healed:
        report.notes.append("%d node(s) kept float32 that the training run healed (%s; delete it to "
                            "convert them)" % (len(healed), next(iter(healed.values()))))


def _explain_out_of_range(report: RewriteReport, out_of_range: Dict[str, str]) -> None:
    """Nodes kept float32 for an out-of-range constant get that reason, naming the constant."""
    for decision in report.decisions:
        const = out_of_range.get(decision.name)
        if const is not None:
            decision.reason = ("kept float32: it reads constant %r, whose values do not fit %s "
                               "(--out-of-range keep-float32)" % (const, report.dtype))
            decision.related = const
            decision.rule = "constant_out_of_range"


def _explain_folded(report: RewriteReport, constants) -> None:
    """Constants folded in place now hold half values: their decisions say so."""
    folded = {item.name: item for item in constants.constants if item.node == item.name}
    for decision in report.decisions:
        item = folded.get(decision.name)
        if item is not None:
            decision.dtype = report.dtype
            decision.related = item.consumers[0] if item.consumers else None
            decision.reason = "constant folded to %s: it feeds only %s ops (%s)" % (
                report.dtype, report.dtype, ", ".join(repr(name) for name in item.consumers[:3]))
            decision.rule = "constant_folded"


def refuse_converted(saved: SavedGraph, dtype: str) -> None:
    """Raises ConversionError if ``saved`` already runs allow-list ops in half or has AMP Casts."""
    allow = builtin_lists(dtype).allow
    half_ops = [node.name for node in saved.graph_def.node
                if node.op in allow and any(value.type in _HALF_ENUMS for value in node.attr.values())]
    casts = [node.name for node in saved.graph_def.node if node.name.endswith(_AMP_SUFFIX)]
    if not half_ops and not casts:
        return
    evidence = []
    if half_ops:
        evidence.append("%d MatMul/Conv-type node(s) already run in half, e.g. %r" % (
            len(half_ops), half_ops[0]))
    if casts:
        evidence.append("%d node(s) named *-%s, e.g. %r" % (len(casts), _AMP_SUFFIX, casts[0]))
    raise ConversionError("%s is already converted (%s)" % (saved.path, "; ".join(evidence)),
                          "Convert the original float32 graph, or pass --force to rewrite it again")


def matching_nodes(graph_def, patterns: Sequence[str]) -> List[str]:
    """Names of the nodes matching any of the regular expressions (``re.match``, from the start)."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ConversionError("--nodes-to-exclude %r is not a regular expression (%s)" % (pattern, error),
                                  "Quote it, and escape special characters such as [ ( *") from None
    return [node.name for node in graph_def.node if any(regex.match(node.name) for regex in compiled)]


def _unused_options(graph_def, options: ConvertOptions) -> List[str]:
    """Warnings for exclusions that match nothing (usually a typo)."""
    op_types = {node.op for node in graph_def.node}
    warnings = []
    for option, values in (("--op-types-to-exclude", options.op_types_to_exclude),
                           ("--op-types-to-include", options.op_types_to_include)):
        for op in values:
            if op not in op_types:
                close = close_op_types(op, op_types)
                warnings.append("%s %s: the graph has no op of that type%s" % (
                    option, op, " (did you mean %s?)" % " or ".join(close) if close else ""))
    for pattern in options.nodes_to_exclude:
        if not matching_nodes(graph_def, [pattern]):
            warnings.append("--nodes-to-exclude %r matches no node (patterns match from the start "
                            "of the name, e.g. 'block1/.*')" % pattern)
    return warnings

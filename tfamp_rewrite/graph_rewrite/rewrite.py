"""``rewrite_graph_def``: GraphDef in, mixed-precision GraphDef out, and a report.

The one pure core of the package (sessions, the command line and the env switch are
front doors onto it).  Per graph (and per reachable function body, as Grappler's
meta-optimizer does)::

    eligible  = not preserved (fetch/feed) and on a device the target converts
    upgrade eligible FusedBatchNorm(Grad) to V2 with U=float32
    view      = GraphView(graph)          # (node, type attribute) vertices and edges
    paint     = Painter(...).paint()      # allow / deny sets (see painter.py)
    apply_paint(view, paint)              # half type attributes, shared Casts
    numerics="emulate": emulate_half(...)  # float32 kernels on values rounded to half
    report    = ReportBuilder(...).build()
    compat="tf1.15": strip_default_attrs(...)  # what TF 1.15 can read (forward_compat.py)

The input GraphDef is never modified.
"""
from __future__ import annotations

import contextlib
import gc
import re
from dataclasses import dataclass
from typing import Dict, Iterable, Mapping, Optional

from tensorflow.core.framework import graph_pb2

from ..dtypes import DT_FLOAT, TARGET_DTYPES
from ..errors import GraphRewriteError
from ..tf_compat import KernelIndex, lookup_op_def, registered_op_names
from .casts import AppliedPaint, apply_paint
from .compat import AUTO, resolve_compat
from .decisions import ReportBuilder
from .eligibility import EXCLUDED_BY_NAME, TARGETS, HalfSupport, node_eligibility
from .emulation import EmulationReport, computing_in_half, emulate_half
from .forward_compat import strip_debug_names, strip_default_attrs
from .functions import (
    UnsupportedFunction,
    body_as_graph,
    graph_as_body,
    input_pipeline_functions,
    reachable_functions,
)
from .graph_view import GraphView, parse_input
from .op_lists import ListsOverride, OpLists, effective_lists, env_warnings, read_level
from .painter import Painter, PaintRules, rules_for
from .report import FunctionReport, RewriteReport

NUMERICS = ("native", "emulate")
_KERNELS = KernelIndex()
_BATCH_NORM_V2 = {"FusedBatchNorm": "FusedBatchNormV2", "FusedBatchNormGrad": "FusedBatchNormGradV2"}


@dataclass
class RewriteResult:
    """The rewritten graph and the report of every decision."""

    graph_def: graph_pb2.GraphDef
    report: RewriteReport


@dataclass(frozen=True)
class RewriteOptions:
    """Validated arguments of one rewrite."""

    dtype: str
    target: str
    compat: str
    lists: OpLists
    rules: PaintRules
    numerics: str = "native"

    @property
    def target_dtype(self) -> int:
        return TARGET_DTYPES[self.dtype]

    @property
    def indexed_cast_names(self) -> bool:
        return self.compat != "tf1.15"


def make_options(dtype: str = "float16", target: str = "gpu", compat: str = AUTO,
                 lists: ListsOverride = None, environ: Mapping[str, str] = None,
                 numerics: str = "native") -> RewriteOptions:
    """Validates the arguments and reads the list / level environment variables."""
    if numerics not in NUMERICS:
        raise ValueError("numerics=%r is not supported; use 'native' (half kernels) or 'emulate' "
                         "(float32 kernels on values rounded to half)" % (numerics,))
    if dtype not in TARGET_DTYPES:
        raise ValueError("dtype=%r is not supported; use 'float16' or 'bfloat16'" % (dtype,))
    if target not in TARGETS:
        raise ValueError("target=%r is not supported; use 'gpu' or 'cpu'" % (target,))
    compat = resolve_compat(compat, dtype)
    level = read_level(environ)
    if level == "UNSAFE_FORCE_ALL" and dtype == "bfloat16":
        raise ValueError("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL=UNSAFE_FORCE_ALL cannot be "
                         "used with dtype='bfloat16' (many ops lack bfloat16 kernels); unset it")
    return RewriteOptions(dtype=dtype, target=target, compat=compat,
                          lists=effective_lists(dtype, compat, lists, environ),
                          rules=rules_for(compat, dtype, force_all=level == "UNSAFE_FORCE_ALL"),
                          numerics=numerics)


def rewrite_graph_def(graph_def, *, fetches: Iterable = (), feeds: Iterable = (),
                      dtype: str = "float16", target: str = "gpu", compat: str = AUTO,
                      lists: ListsOverride = None, op_types_to_exclude: Iterable[str] = (),
                      nodes_to_exclude: Iterable[str] = (), numerics: str = "native") -> RewriteResult:
    """Returns a mixed-precision copy of ``graph_def`` and the report of every decision.

    Args:
      graph_def: a ``GraphDef`` (not modified).
      fetches, feeds: node or tensor names (or objects with ``.name``) whose nodes must
        keep their dtypes.
      dtype: ``"float16"`` or ``"bfloat16"``.
      target: ``"gpu"`` (convert unplaced and GPU nodes) or ``"cpu"`` (CPU nodes too).
      compat: ``"auto"`` (the running TensorFlow's pass), ``"latest"`` (newest TensorFlow),
        ``"tf2.15"`` or ``"tf1.15"`` (that version's lists and algorithm; ``"tf1.15"`` also
        leaves default-valued attributes out, so TensorFlow 1.15 can read a graph a newer
        TensorFlow wrote).  See compat.py; the report names the compat used.
      lists: an ``OpLists`` replacing the lists, or a mapping of edits such as
        ``{"deny_add": ["Tanh"], "clear_remove": ["Relu"]}`` applied after the
        environment variables.
      op_types_to_exclude, nodes_to_exclude: op types, and node names (or regular
        expressions matched from the start of node names), left exactly as they are (like
        fetches; unlike deny-listing, nothing downstream is affected).
      numerics: ``"native"`` (half nodes get half kernels) or ``"emulate"`` (the same
        decisions, but half nodes run float32 kernels on values rounded to half at every
        half tensor: what a Tensor Core GPU computes, on any CPU at float32 speed; see
        emulation.py).

    ``report.warnings`` names what in the list environment variables is probably a typo
    (see ``op_lists.env_warnings``); TensorFlow's pass ignores such names without a word.

    Raises:
      ValueError: bad arguments, conflicting op lists, or a fetch/feed not in the graph.
      GraphRewriteError: the graph is malformed (the error names the node).
    """
    options = make_options(dtype, target, compat, lists, numerics=numerics)
    output = graph_pb2.GraphDef()
    output.CopyFrom(graph_def)
    with _no_cyclic_gc():
        result = _rewrite_copy(output, fetches, feeds, options, op_types_to_exclude, nodes_to_exclude)
    if not isinstance(lists, OpLists):  # an OpLists replaces the environment's edits
        in_graph = {node.op for node in graph_def.node}
        in_graph.update(node.op for function in graph_def.library.function for node in function.node_def)
        result.report.warnings.extend(env_warnings(
            lambda op: op in in_graph or lookup_op_def(op) is not None, registered_op_names))
    return result


def _rewrite_copy(output, fetches, feeds, options, op_types_to_exclude, nodes_to_exclude):
    """``rewrite_graph_def`` on its private copy ``output``."""
    known = {node.name for node in output.node}
    preserved = {name: EXCLUDED_BY_NAME for name in _excluded_nodes(known, nodes_to_exclude)}
    preserved.update(_preserved(known, feeds, "feed", "preserved: feed"))
    preserved.update(_preserved(known, fetches, "fetch", "preserved: fetch"))
    excluded_ops = frozenset(op_types_to_exclude)
    if excluded_ops:
        preserved.update({node.name: "excluded: op type %s" % node.op
                          for node in output.node if node.op in excluded_ops})
    report = rewrite_in_place(output, preserved, options)
    report.functions = rewrite_library(output, options)
    if options.compat == "tf1.15":
        stripped = strip_default_attrs(output, op_def_lookup(output))
        if stripped:
            report.notes.append("%d default-valued attribute(s) left out, so that TensorFlow 1.15 "
                                "reads the graph (it fills in defaults)" % stripped)
        debug_names = strip_debug_names(output)
        if debug_names:
            report.notes.append("%d resource variable debug_name attribute(s) left out: TensorFlow "
                                "1.15's VarHandleOp has none, and it only names the variable in "
                                "error messages" % debug_names)
    return RewriteResult(output, report)


def rewrite_in_place(graph_def, preserved: Mapping[str, str], options: RewriteOptions,
                     function_ops: Optional[frozenset] = None) -> RewriteReport:
    """Runs the pass on ``graph_def`` itself (callers pass a private copy)."""
    if function_ops is None:
        function_ops = frozenset(f.signature.name for f in graph_def.library.function)
    eligible, reasons = node_eligibility(graph_def.node, options.target, preserved)
    upgraded = _upgrade_batch_norm(graph_def.node, eligible)
    view = GraphView(graph_def, op_def_lookup(graph_def), function_ops)
    half = HalfSupport(view, options.target_dtype, options.target, _KERNELS)
    paint = Painter(view, options.lists, eligible, half, options.rules).paint()
    applied = AppliedPaint() if paint.nothing_to_do else apply_paint(
        view, paint, options.target_dtype, options.indexed_cast_names)
    report = RewriteReport(dtype=options.dtype, target=options.target, compat=options.compat,
                           numerics=options.numerics)
    ReportBuilder(view, options.lists, eligible, reasons, half, paint, applied,
                  options.target_dtype).build(report)
    if options.numerics == "emulate":
        native = computing_in_half(view)  # the view holds the dtypes before this rewrite
        report.emulation = (emulate_half(graph_def, [view.nodes[i].name for i in applied.converted_nodes],
                                         op_def_lookup(graph_def), function_ops)
                            if applied.converted_nodes else EmulationReport())
        report.emulation.native_half_nodes = native
    if upgraded:
        report.notes.append("%d FusedBatchNorm(Grad) node(s) upgraded to the V2 op with U=float32"
                            % upgraded)
    return report


INPUT_PIPELINE_REASON = ("a tf.data function: the input pipeline runs on the host, and TensorFlow's "
                         "own pass leaves it float32 too")


def rewrite_library(graph_def, options: RewriteOptions):
    """Rewrites every function body the graph reaches; returns one FunctionReport each."""
    lookup = op_def_lookup(graph_def)
    function_ops = frozenset(f.signature.name for f in graph_def.library.function)
    reachable = reachable_functions(graph_def)
    input_pipeline = input_pipeline_functions(graph_def)
    by_name = {f.signature.name: f for f in graph_def.library.function}
    reports = []
    for name in by_name:
        if name not in reachable:
            reports.append(FunctionReport(name, "untouched", "not called from the graph"))
            continue
        if name in input_pipeline:
            reports.append(FunctionReport(name, "untouched", INPUT_PIPELINE_REASON))
            continue
        fdef = by_name[name]
        try:
            body = body_as_graph(fdef, lookup)
            preserved = {arg: "preserved: function argument" for arg in body.arg_nodes}
            preserved.update({node: "preserved: function output" for node in body.retval_nodes.values()})
            preserved.update(_stateful_nodes(body.graph, lookup))
            report = rewrite_in_place(body.graph, preserved, options, function_ops)
            rewritten = graph_as_body(body, fdef, lookup)
        except (UnsupportedFunction, GraphRewriteError) as error:
            reports.append(FunctionReport(name, "untouched", str(error)))
            continue
        fdef.CopyFrom(rewritten)
        reports.append(FunctionReport(name, "rewritten", report=report))
    return reports


def emulate_rewritten(graph_def, report: RewriteReport):
    """A copy of ``graph_def``, rewritten natively as ``report`` says, that runs emulated.

    For graphs changed after the rewrite (the command line folds constants into half and
    may make inputs half): the nodes the rewrite converted -- in the graph and in each
    function body it rewrote -- run float32 kernels on values rounded to half; every other
    half tensor (a folded constant, a half input) is widened where they read it.  Returns
    ``(graph_def, EmulationReport)``; ``graph_def`` is not modified.
    """
    output = graph_pb2.GraphDef()
    output.CopyFrom(graph_def)
    lookup = op_def_lookup(output)
    function_ops = frozenset(f.signature.name for f in output.library.function)
    total = emulate_half(output, _converted(report), lookup, function_ops)
    by_name = {f.signature.name: f for f in output.library.function}
    for function in report.functions:
        fdef = by_name.get(function.name)
        if function.report is None or fdef is None:
            continue
        body = body_as_graph(fdef, lookup)
        total.add(emulate_half(body.graph, _converted(function.report), lookup, function_ops))
        fdef.CopyFrom(graph_as_body(body, fdef, lookup))
    return output, total


def _converted(report: RewriteReport):
    return [decision.name for decision in report.decisions if decision.converted]


def op_def_lookup(graph_def):
    """``op type -> OpDef`` for ``graph_def``: TensorFlow's registry, then the graph's functions."""
    signatures = {f.signature.name: f.signature for f in graph_def.library.function}

    def lookup(op_type: str):
        op_def = lookup_op_def(op_type)
        return op_def if op_def is not None else signatures.get(op_type)

    return lookup


def _stateful_nodes(graph_def, lookup) -> Dict[str, str]:
    """Grappler keeps stateful ops of a function body as they are."""
    result = {}
    for node in graph_def.node:
        op_def = lookup(node.op)
        if op_def is not None and op_def.is_stateful and node.op not in ("_Arg", "_Retval"):
            result[node.name] = "preserved: stateful op in a function body"
    return result


@contextlib.contextmanager
def _no_cyclic_gc():
    """The pass allocates millions of small acyclic objects; cyclic GC would rescan them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _texts(names: Iterable, role: str):
    """Each of ``names`` (one name, or several: strings, bytes, tensors or operations) as text."""
    if isinstance(names, (str, bytes)) or hasattr(names, "name"):
        names = [names]
    for item in names:
        text = getattr(item, "name", item)
        if isinstance(text, bytes):
            text = text.decode()
        if not isinstance(text, str):
            raise ValueError("%ss must be node or tensor names; got %r" % (role, item))
        yield text


def _preserved(known, names: Iterable, role: str, reason: str) -> Dict[str, str]:
    """``{node name: reason}`` for fetches / feeds, validated against ``known``."""
    result = {}
    for text in _texts(names, role):
        node, _ = parse_input(text)
        if node not in known:
            raise ValueError("%s %r is not a node of the graph; pass node or tensor names such "
                             "as 'logits' or 'logits:0'" % (role, text))
        result[node] = reason
    return result


_TENSOR_NAME = re.compile(r"(.+):(\d+)")


def _excluded_nodes(known, items: Iterable) -> list:
    """The nodes ``nodes_to_exclude`` names: node or tensor names, or regular expressions
    matched from the start of node names (as ``tfamp-rewrite convert --nodes-to-exclude``
    and the session's log lines give them, ``'^dense/MatMul$'``)."""
    names = []
    for text in _texts(items, "node to exclude"):
        tensor = _TENSOR_NAME.fullmatch(text)
        if text in known or (tensor is not None and tensor.group(1) in known):
            names.append(text if text in known else tensor.group(1))
            continue
        try:
            pattern = re.compile(text)
        except re.error:
            pattern = None
        matched = sorted(name for name in known if pattern is not None and pattern.match(name))
        if not matched:
            raise ValueError("node to exclude %r is neither a node of the graph nor a pattern matching "
                             "one; pass node or tensor names such as 'logits' or 'logits:0', or "
                             "regular expressions such as '^logits$'" % text)
        names.extend(matched)
    return names


def _upgrade_batch_norm(nodes, eligible) -> int:
    """Eligible FusedBatchNorm(Grad) become the V2 op, whose U attribute may stay float32."""
    count = 0
    for node, ok in zip(nodes, eligible):
        if ok and node.op in _BATCH_NORM_V2:
            node.op = _BATCH_NORM_V2[node.op]
            node.attr["U"].type = DT_FLOAT
            count += 1
    return count

"""Which tensors the rewrite holds in half, and what each one is: ``plan_probes``.

A tensor is *half-bound* when the mixed-precision graph holds it in half: an output of a
node the rewrite converts, or a float32 tensor a converted node reads (through a Cast to
half, which is where it would overflow or flush).  For each, ``half_nodes`` are the
converted nodes that would have to stay float32 for it to stay float32: its producer,
if converted, and every converted reader.

Each tensor has a *role*, read from the graph's structure as TensorFlow's ``tf.gradients``
builds it (a name scope ``gradients``, ``gradients_1``, ... seeded by a ``Fill`` of ones)::

    backward  = nodes in a gradients name scope
    gradient  = backward nodes reached by data edges from a seed (Fill / OnesLike whose
                float inputs are constants): the values the loss scale multiplies
    weight gradient   = a gradient tensor read outside the backward pass (by the optimizer,
                        the unscale step) or named by the caller, or through Identity /
                        AddN by one that is
    activation gradient = every other gradient tensor
    forward   = everything else (in the backward scope too: e.g. a reciprocal of a
                forward value, which the loss scale does not multiply)

Tensors that cannot be fetched from outside a loop or a branch are not probed: nodes in
a TF1 while loop or ``cond`` branch, nesting followed exactly (graph_rewrite/control_flow.py),
and constants (their values are known: the converter checks them itself).
``ProbePlan.skipped`` counts them by reason.  A copy of a probed tensor (Identity, Reshape,
...) holds the same values: its readers join that tensor's probe.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from ..dtypes import DT_FLOAT, HALF_DTYPES
from ..graph_rewrite.control_flow import control_flow_of
from ..graph_rewrite.graph_view import GraphView
from ..graph_rewrite.report import RewriteReport
from ..graph_rewrite.rewrite import op_def_lookup

FORWARD = "forward"
ACTIVATION_GRADIENT = "activation_gradient"
WEIGHT_GRADIENT = "weight_gradient"
ROLES = (FORWARD, ACTIVATION_GRADIENT, WEIGHT_GRADIENT)
GRADIENT_ROLES = (ACTIVATION_GRADIENT, WEIGHT_GRADIENT)

_BACKWARD_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")
_UNSCALE_SCOPE = re.compile(r"(^|/)unscale_and_check_finite(_\d+)?/")
_SEED_OPS = frozenset({"Fill", "OnesLike"})
# A weight gradient passes back through these to the tensor that holds its values (a conv1d
# kernel's gradient is its Conv2DBackpropFilter's output reshaped).
_PASS_BACK = frozenset({"Identity", "IdentityN", "AddN", "Snapshot", "Reshape", "Squeeze", "ExpandDims"})
_CONSTANTS = frozenset({"Const", "HostConst"})
# Outputs holding exactly the values of their first input: probed through that input.
_COPIES = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient", "Reshape", "Squeeze",
                     "ExpandDims", "EnsureShape", "CheckNumerics"})
# Ops whose results are integers whatever their input holds (the rewrite converts a Shape of
# a half tensor with it).
INTEGER_RESULTS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
# Readers of a tensor's shape only: holding it in half changes nothing they compute.
SHAPE_READERS = INTEGER_RESULTS | {"ZerosLike", "OnesLike"}
# Ops that turn finite inputs into inf/nan, op -> (the inputs that can make them do so,
# what the op does with them): a divisor of 0, a log of 0, an exp of 100.
NONFINITE_MAKERS = {
    "Div": ((1,), "divides by"), "RealDiv": ((1,), "divides by"), "FloorDiv": ((1,), "divides by"),
    "Xdivy": ((1,), "divides by"), "FloorMod": ((1,), "divides by"),
    "Reciprocal": ((0,), "takes the reciprocal of"), "Inv": ((0,), "takes the reciprocal of"),
    "Log": ((0,), "takes the log of"), "Log1p": ((0,), "takes the log of"),
    "Xlogy": ((1,), "takes the log of"),
    "Sqrt": ((0,), "takes the square root of"), "Rsqrt": ((0,), "takes the square root of"),
    "SqrtGrad": ((0,), "divides by the square root"),
    "Pow": ((0, 1), "raises to a power"), "Exp": ((0,), "exponentiates"), "Expm1": ((0,), "exponentiates"),
    "Acos": ((0,), "takes the arccosine of"), "Asin": ((0,), "takes the arcsine of"),
    "Atanh": ((0,), "takes the inverse tanh of"), "Acosh": ((0,), "takes the inverse cosh of"),
    "Lgamma": ((0,), "takes the log-gamma of"), "Digamma": ((0,), "takes the digamma of"),
}


@dataclass
class HalfNode:
    """A converted node that holds a tensor in half."""

    name: str
    op: str
    category: Optional[str]


@dataclass
class Probe:
    """One half-bound tensor to measure."""

    tensor: str                  # "node:port"
    node: str                    # its producer
    op: str
    category: Optional[str]      # the producer's op list (allow / infer / deny / clear / None)
    role: str                    # forward / activation_gradient / weight_gradient
    half_nodes: List[HalfNode] = field(default_factory=list)  # converted nodes that hold it in half


@dataclass
class ProbePlan:
    """The tensors to probe, and how many half-bound tensors cannot be, by reason."""

    probes: List[Probe] = field(default_factory=list)
    skipped: Dict[str, int] = field(default_factory=dict)


def plan_probes(graph_def, rewritten_def, report: RewriteReport,
                weight_gradients: Iterable[str] = ()) -> ProbePlan:
    """The half-bound tensors of ``graph_def`` (float32) that ``rewritten_def`` holds in half.

    ``report`` is the rewrite's report (its decisions say which nodes are converted);
    ``weight_gradients`` names tensors known to be weight gradients (``tf.gradients``'
    results, when nothing reads them yet).
    """
    original = _view(graph_def)
    rewritten = _view(rewritten_def)
    converted = [d.name for d in report.decisions if d.converted and d.name in original.index
                 and d.name in rewritten.index]
    by_name = {d.name: d for d in report.decisions}
    half_nodes: Dict[Tuple[int, int], List[str]] = {}
    for name in converted:
        i, r = original.index[name], rewritten.index[name]
        for port in range(len(original.out_attrs[i] or ())):
            if _dtype_out(original, i, port) == DT_FLOAT and _dtype_out(rewritten, r, port) in HALF_DTYPES:
                half_nodes.setdefault((i, port), []).insert(0, name)
        if len(rewritten.inputs[r]) != len(original.inputs[i]):
            continue
        for k, (src, port) in enumerate(original.inputs[i]):
            if original.ops[i] in SHAPE_READERS:
                break
            if (_dtype_out(original, src, port) == DT_FLOAT
                    and rewritten.vertex_dtype[rewritten.input_vertex(r, k)] in HALF_DTYPES):
                readers = half_nodes.setdefault((src, port), [])
                if name not in readers:
                    readers.append(name)
    unfetchable = _in_control_flow(original)
    roles = _roles(original, weight_gradients)
    _merge_copies(original, half_nodes, unfetchable)
    plan = ProbePlan()
    for (i, port), holders in sorted(half_nodes.items()):
        node = original.nodes[i]
        reason = unfetchable.get(i) or ("a constant" if original.ops[i] in _CONSTANTS else None)
        if reason:
            plan.skipped[reason] = plan.skipped.get(reason, 0) + 1
            continue
        plan.probes.append(Probe(tensor="%s:%d" % (node.name, port), node=node.name, op=node.op,
                                 category=_category(by_name, node.name),
                                 role=roles.get((i, port), FORWARD),
                                 half_nodes=[HalfNode(n, by_name[n].op, by_name[n].category)
                                             for n in holders]))
    return plan


def plan_boundary_probes(graph_def, report: RewriteReport) -> List[Probe]:
    """Float32 outputs of unconverted nodes that read a converted node's output.

    There a value a half tensor lost -- flushed to zero, rounded to 1 -- can turn inf or nan
    in float32 (``log(1e-10 + p)`` with ``p`` half).  ``half_nodes`` are those converted
    producers: what must stay float32 if the output turns non-finite from finite inputs.
    """
    view = _view(graph_def)
    by_name = {d.name: d for d in report.decisions}
    converted = {d.name for d in report.decisions if d.converted}
    unfetchable = _in_control_flow(view)
    roles = _roles(view)
    probes = []
    for i, node in enumerate(view.nodes):
        if node.name in converted or i in unfetchable or view.ops[i] in SHAPE_READERS:
            continue
        producers = list(dict.fromkeys(view.nodes[src].name for src, _ in view.inputs[i]
                                       if view.nodes[src].name in converted))
        if not producers:
            continue
        for port in range(len(view.out_attrs[i] or ())):
            if _dtype_out(view, i, port) == DT_FLOAT:
                probes.append(Probe(tensor="%s:%d" % (node.name, port), node=node.name, op=node.op,
                                    category=None, role=roles.get((i, port), FORWARD),
                                    half_nodes=[HalfNode(n, by_name[n].op, by_name[n].category)
                                                for n in producers]))
    return probes


def plan_float32_maker_probes(graph_def, report: RewriteReport) -> List[Probe]:
    """Float32 outputs of unconverted ``NONFINITE_MAKERS`` (a loss divided by a count of
    positives): where an inf/nan can start in float32 itself, from finite values.

    Probed beside the half-bound tensors, they tell an inf/nan float32 makes of values no
    half tensor computes (0/0 when a batch has no positives) from one a half tensor upstream
    caused.  ``half_nodes`` is empty: what holds such a value in half is found by a walk up.
    """
    view = _view(graph_def)
    converted = {d.name for d in report.decisions if d.converted}
    unfetchable = _in_control_flow(view)
    roles = _roles(view)
    return [Probe(tensor="%s:0" % node.name, node=node.name, op=node.op, category=None,
                  role=roles.get((i, 0), FORWARD))
            for i, node in enumerate(view.nodes)
            if view.ops[i] in NONFINITE_MAKERS and node.name not in converted and i not in unfetchable
            and view.out_attrs[i] and _dtype_out(view, i, 0) == DT_FLOAT]


def _merge_copies(view: GraphView, half_nodes: Dict[Tuple[int, int], List[str]], unfetchable) -> None:
    """A copy of a probed tensor (Identity, Reshape, ...) holds its values: one probe serves both."""
    def source(tensor):
        i, port = tensor
        while (port == 0 and view.ops[i] in _COPIES and view.inputs[i] and i not in unfetchable
               and view.inputs[i][0] in half_nodes and view.inputs[i][0][0] not in unfetchable):
            i, port = view.inputs[i][0]
        return i, port

    for tensor in sorted(half_nodes):
        root = source(tensor)
        if root != tensor:
            holders = half_nodes[root]
            holders.extend(name for name in half_nodes.pop(tensor) if name not in holders)


def _category(decisions, name: str) -> Optional[str]:
    decision = decisions.get(name)
    return decision.category if decision is not None else None


def _view(graph_def) -> GraphView:
    functions = frozenset(f.signature.name for f in graph_def.library.function)
    return GraphView(graph_def, op_def_lookup(graph_def), functions)


def _dtype_out(view: GraphView, node: int, port: int) -> int:
    return view.vertex_dtype[view.output_vertex(node, port)]


def _in_control_flow(view: GraphView) -> Dict[int, str]:
    """Nodes whose outputs cannot be fetched from outside: in a while loop or a cond branch."""
    return control_flow_of(view.ops, [[src for src, _ in view.inputs[i]] + list(view.control_inputs[i])
                                      for i in range(len(view.nodes))])


def in_unscale_scope(name: str) -> bool:
    """Whether node ``name`` belongs to a loss-scaled step's unscale and finite check."""
    return bool(_UNSCALE_SCOPE.search(name))


def in_backward_scope(name: str) -> bool:
    """Whether node ``name`` belongs to a backward pass (a ``gradients/`` scope)."""
    return bool(_BACKWARD_SCOPE.search(name))


def _roles(view: GraphView, weight_gradients: Iterable[str] = ()) -> Dict[Tuple[int, int], str]:
    """``(node, port) -> role`` for gradient tensors (everything else is forward)."""
    backward = {i for i, node in enumerate(view.nodes) if _BACKWARD_SCOPE.search(node.name)}
    seeds = [i for i in backward if view.ops[i] in _SEED_OPS and all(
        view.ops[src] in _CONSTANTS or _dtype_out(view, src, port) != DT_FLOAT
        for src, port in view.inputs[i])]
    gradient: Set[int] = set()
    stack = list(seeds)
    while stack:
        i = stack.pop()
        if i in gradient:
            continue
        gradient.add(i)
        stack.extend(dst for _, dst, _ in view.consumers[i] if dst in backward and dst not in gradient)
    weight: Set[Tuple[int, int]] = set()
    stack = [(i, port) for i in gradient for port, dst, _ in view.consumers[i] if dst not in backward]
    for name in weight_gradients:
        node, _, port = name.partition(":")
        if node in view.index and view.index[node] in gradient:
            stack.append((view.index[node], int(port or 0)))
    while stack:
        tensor = stack.pop()
        if tensor in weight:
            continue
        weight.add(tensor)
        i = tensor[0]
        if view.ops[i] in _PASS_BACK:
            stack.extend((src, port) for src, port in view.inputs[i] if src in gradient)
    roles = {}
    for i in gradient:
        for port in range(len(view.out_attrs[i] or ())):
            roles[(i, port)] = WEIGHT_GRADIENT if (i, port) in weight else ACTIVATION_GRADIENT
    for i in _unscaling(view, gradient):
        for port in range(len(view.out_attrs[i] or ())):
            roles[(i, port)] = WEIGHT_GRADIENT
    return roles


def _unscaling(view: GraphView, gradient: Set[int]) -> Set[int]:
    """The nodes of a loss-scaled step's unscale (``unscale_and_check_finite`` scope, its fused
    op included) fed by the gradients: they hold the weight gradients divided by the scale,
    so they overflow only when the scaled gradients did, and the loss scale's rule is theirs."""
    found: Set[int] = set()
    stack = [dst for i in gradient for _, dst, _ in view.consumers[i]]
    while stack:
        i = stack.pop()
        if i in found or i in gradient or not _UNSCALE_SCOPE.search(view.nodes[i].name):
            continue
        found.add(i)
        stack.extend(dst for _, dst, _ in view.consumers[i])
    return found

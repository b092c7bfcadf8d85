"""Decides which type-attribute vertices become half: TensorFlow's painting passes.

``Painter(view, lists, eligible, half, rules).paint() -> Paint`` runs, in order::

    groups  = data-structure groups (TensorList clusters; TF 1.15: Stack/TensorArray)
    P1 allow   : every vertex of an eligible allow-list node
                 (nothing allowed -> nothing to do)
    P2 deny    : U = deny/infer vertices + clear vertices upstream of them (inputs only)
                 paint deny everything reachable downstream of a deny-list vertex inside U
                 i.e. deny -> (clear|infer)* -> (infer|deny) paths; a clear-only tail is not painted
    match      : each data-structure group all deny, else all allow
    P3 between : D = vertices downstream of allow ops through eligible float32 clear/infer
                 vertices that support half and are not deny;
                 paint allow the vertices of D upstream of an allow op
    P4 infer after allow (newest only): an eligible float32 infer vertex whose direct
                 inputs include an allow vertex and no deny vertex becomes allow
    P5 clear flood: from every allow vertex, through inputs and outputs, paint allow the
                 eligible float32 clear vertices that support half, are not deny and do not
                 read a reference variable (Identity of VariableV2, Enter chains over one)
    P6 (not TF 1.15): allow-list vertices whose OpDef does not allow half leave allow
    match      : data-structure groups again
    loops      : a NextIteration and the Merge nodes it feeds are allow only if all are
    casts      : an existing Cast to float32 whose consumers are all allow becomes allow

Each decision is recorded with the rule and the vertex it came from, for the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Set, Tuple

from ..dtypes import DT_FLOAT, QUANTIZED
from ..errors import GraphRewriteError
from .data_structures import (
    DataStructureGroups,
    force_color_match,
    stack_and_tensor_array_groups,
    tensor_list_groups,
)
from .eligibility import HalfSupport
from .graph_view import GraphView
from .op_lists import OpLists

# Rules recorded in Paint.why (the report turns them into sentences).
ALLOW_LIST = "allow_list"
FORCED = "forced"
BETWEEN_ALLOW = "between_allow"
INFER_AFTER_ALLOW = "infer_after_allow"
CLEAR_FLOOD = "clear_flood"
GROUP_MATCH = "group_match"
LOOP_MATCH = "loop_match"
EXISTING_CAST = "existing_cast"
DENY_LIST = "deny_list"
DENY_PATH = "deny_path"
GROUP_UNSAFE = "group_unsafe"
LOOP_MISMATCH = "loop_mismatch"
NO_HALF_OPDEF = "no_half_opdef"

Why = Tuple[str, Optional[int], Optional[int]]
_CATEGORY_CODES = {"allow": 1, "infer": 2, "deny": 3, "clear": 4, None: 0}
ALLOW, INFER, DENY, CLEAR = 1, 2, 3, 4


@dataclass(frozen=True)
class PaintRules:
    """The algorithm differences between TensorFlow versions."""

    infer_after_allow: bool = True        # P4: TF >= 2.19 in every mode
    remove_unsupported_allow: bool = True  # P6: not in TF 1.15
    data_structures: str = "tensor_list"   # or "stack_tensor_array" (TF 1.15)
    force_all: bool = False                # LEVEL=UNSAFE_FORCE_ALL


@dataclass
class Paint:
    """The result of painting: allow and deny vertex sets, and why each got its colour.

    ``why[v] = (rule, related, other)``: ``related`` is the vertex the rule refers to (the
    allow op upstream, the deny root, the sibling...) and ``other`` a second one (the
    allow op downstream, for ``between_allow``), each possibly None.  ``unpainted[v]``
    records vertices that left the allow set again.  ``nothing_to_do`` is set when no
    allow-list vertex exists.
    """

    allow: Set[int] = field(default_factory=set)
    deny: Set[int] = field(default_factory=set)
    why: Dict[int, Why] = field(default_factory=dict)
    unpainted: Dict[int, Why] = field(default_factory=dict)
    group_notes: Dict[int, str] = field(default_factory=dict)
    nothing_to_do: bool = False


class Painter:
    """Runs the passes of the module docstring over one GraphView."""

    def __init__(self, view: GraphView, lists: OpLists, eligible: Sequence[bool],
                 half: HalfSupport, rules: PaintRules = PaintRules()):
        self.view = view
        self.eligible = eligible
        self.half = half
        self.rules = rules
        by_op: Dict[str, int] = {}
        self.category = []
        for op in view.ops:
            code = by_op.get(op)
            if code is None:
                code = by_op[op] = _CATEGORY_CODES[lists.category(op)]
            self.category.append(code)
        # Per vertex: its node's category and eligibility, looked up once.
        self.vcat = [self.category[n] for n in view.vertex_node]
        self.veligible = [eligible[n] for n in view.vertex_node]
        self.paint_result = Paint()

    # -- driver -------------------------------------------------------------------
    def paint(self) -> Paint:
        paint = self.paint_result
        groups = self._data_structure_groups()
        self._allow_list_ops()
        if not paint.allow:
            paint.nothing_to_do = True
            return paint
        for vertex, reason in groups.deny.items():
            self._deny(vertex, GROUP_UNSAFE, None)
            paint.group_notes[vertex] = reason
        if not self.rules.force_all:
            self._propagate_deny()
        self._match_groups(groups)
        self._between_allow()
        if self.rules.infer_after_allow:
            self._infer_after_allow()
        self._clear_flood()
        if self.rules.remove_unsupported_allow:
            self._remove_unsupported_allow()
        self._match_groups(groups)
        self._match_loops()
        self._existing_casts()
        return paint

    def _data_structure_groups(self) -> DataStructureGroups:
        if self.rules.data_structures == "stack_tensor_array":
            groups = stack_and_tensor_array_groups(self.view)
        else:
            groups = tensor_list_groups(self.view, self.eligible)
        for src, dst in groups.implicit_edges:
            self.view.fanout[src].append(dst)
            self.view.fanin[dst].append(src)
        return groups

    # -- helpers ------------------------------------------------------------------
    def _allow(self, vertex: int, rule: str, related: Optional[int] = None,
               other: Optional[int] = None) -> None:
        if vertex not in self.paint_result.allow:
            self.paint_result.allow.add(vertex)
            self.paint_result.why[vertex] = (rule, related, other)

    def _deny(self, vertex: int, rule: str, related: Optional[int] = None) -> None:
        if vertex not in self.paint_result.deny:
            self.paint_result.deny.add(vertex)
            self.paint_result.why[vertex] = (rule, related, None)

    def _unallow(self, vertex: int, rule: str, related: Optional[int] = None) -> None:
        if vertex in self.paint_result.allow:
            self.paint_result.allow.discard(vertex)
            self.paint_result.unpainted[vertex] = (rule, related, None)

    def _is_float(self, vertex: int) -> bool:
        return self.view.vertex_dtype[vertex] == DT_FLOAT

    # -- passes -------------------------------------------------------------------
    def _allow_list_ops(self) -> None:
        """P1: every vertex of an eligible allow-list node (or any node, when forced)."""
        view = self.view
        force = self.rules.force_all
        for vertex, node in enumerate(view.vertex_node):
            if not self.veligible[vertex]:
                continue
            if self.vcat[vertex] == ALLOW:
                self._allow(vertex, ALLOW_LIST, None)
            elif force and _can_force(view, node):
                self._allow(vertex, FORCED, None)

    def _propagate_deny(self) -> None:
        """P2: paint deny -> (clear|infer)* -> (infer|deny) paths."""
        fanin, fanout, vcat = self.view.fanin, self.view.fanout, self.vcat
        upstream: Set[int] = set()
        for root in range(len(vcat)):
            if vcat[root] not in (DENY, INFER):
                continue
            upstream.add(root)
            stack = [root]
            while stack:
                for src in fanin[stack.pop()]:
                    if src not in upstream and vcat[src] == CLEAR:
                        upstream.add(src)
                        stack.append(src)
        deny = self.paint_result.deny
        for root in range(len(vcat)):
            if vcat[root] != DENY or root in deny:
                continue
            self._deny(root, DENY_LIST, None)
            stack = [root]
            while stack:
                for dst in fanout[stack.pop()]:
                    if dst not in deny and dst in upstream:
                        self._deny(dst, DENY_PATH, root)
                        stack.append(dst)

    def _may_become_allow(self, vertex: int, categories) -> bool:
        return (self.vcat[vertex] in categories and self.veligible[vertex]
                and vertex not in self.paint_result.deny and self._is_float(vertex)
                and self.half.supports(vertex))

    def _between_allow(self) -> None:
        """P3: clear/infer vertices both downstream and upstream of allow ops."""
        fanin, fanout, vcat = self.view.fanin, self.view.fanout, self.vcat
        roots = [v for v in range(len(vcat)) if vcat[v] == ALLOW and self.veligible[v]]
        downstream: Dict[int, int] = {}  # vertex -> the allow op vertex it was reached from
        for root in roots:
            downstream.setdefault(root, root)
            stack = [root]
            while stack:
                for dst in fanout[stack.pop()]:
                    if dst not in downstream and self._may_become_allow(dst, (CLEAR, INFER)):
                        downstream[dst] = root
                        stack.append(dst)
        upstream: Set[int] = set()
        for root in roots:
            if root in upstream:
                continue
            upstream.add(root)
            stack = [root]
            while stack:
                for src in fanin[stack.pop()]:
                    if src not in upstream and src in downstream:
                        upstream.add(src)
                        self._allow(src, BETWEEN_ALLOW, downstream[src], root)
                        stack.append(src)

    def _infer_after_allow(self) -> None:
        """P4: infer vertices directly fed by an allow vertex (and by no deny vertex)."""
        fanin = self.view.fanin
        allow, deny = self.paint_result.allow, self.paint_result.deny
        for vertex in range(len(self.vcat)):
            if (self.vcat[vertex] != INFER or not self.veligible[vertex] or vertex in deny
                    or vertex in allow or not self._is_float(vertex)
                    or not self.half.opdef_allows(vertex)):
                continue
            inputs = fanin[vertex]
            if any(src in deny for src in inputs):
                continue
            source = next((src for src in inputs if src in allow), None)
            if source is not None:
                self._allow(vertex, INFER_AFTER_ALLOW, source)

    def _clear_flood(self) -> None:
        """P5: clear vertices connected to an allow vertex through clear vertices."""
        view = self.view
        fanin, fanout = view.fanin, view.fanout
        allow = self.paint_result.allow
        reached: Set[int] = set()
        for root in sorted(allow):
            if root in reached or not self.veligible[root]:
                continue
            reached.add(root)
            stack = [root]
            while stack:
                vertex = stack.pop()
                for other in fanin[vertex] + fanout[vertex]:
                    if (other not in reached and other not in allow
                            and self._may_become_allow(other, (CLEAR,))
                            and not _reads_reference_variable(view, view.vertex_node[other])):
                        reached.add(other)
                        self._allow(other, CLEAR_FLOOD, root)
                        stack.append(other)

    def _remove_unsupported_allow(self) -> None:
        """P6: allow-list vertices that cannot be half (fixed types, float-only attrs, quantized)."""
        view = self.view
        for vertex in sorted(self.paint_result.allow):
            if self.vcat[vertex] != ALLOW:
                continue
            node = view.vertex_node[vertex]
            if not self.half.opdef_allows(vertex) or any(
                    view.vertex_dtype[v] in QUANTIZED for v in view.vertices[node].values()):
                self._unallow(vertex, NO_HALF_OPDEF, None)

    def _match_groups(self, groups: DataStructureGroups) -> None:
        paint = self.paint_result
        for vertex, _, sibling in force_color_match(groups.groups, paint.allow, paint.deny):
            paint.why[vertex] = (GROUP_MATCH, sibling, None)

    def _match_loops(self) -> None:
        """A NextIteration and the Merge nodes it feeds must all be allow, or none."""
        view = self.view
        allow = self.paint_result.allow
        for node, op in enumerate(view.ops):
            if op != "NextIteration":
                continue
            merges = []
            for _, dst, _ in view.consumers[node]:
                if view.ops[dst] != "Merge":
                    raise GraphRewriteError(
                        "NextIteration %r feeds %r (%s); a NextIteration may only feed Merge "
                        "nodes" % (view.nodes[node].name, view.nodes[dst].name, view.ops[dst]),
                        view.nodes[node].name)
                merges.append(view.vertices[dst][("T", -1)])
            next_vertex = view.vertices[node][("T", -1)]
            blocker = next((m for m in merges if m not in allow), None)
            if blocker is None:
                self._allow(next_vertex, LOOP_MATCH, merges[0] if merges else None)
            else:
                for merge in merges:
                    self._unallow(merge, LOOP_MISMATCH, blocker)
                self._unallow(next_vertex, LOOP_MISMATCH, blocker)

    def _existing_casts(self) -> None:
        """A Cast to float32 whose consumers are all allow casts to half instead."""
        view = self.view
        allow = self.paint_result.allow
        for node, op in enumerate(view.ops):
            if op != "Cast":
                continue
            dst_t = view.vertices[node].get(("DstT", -1))
            if dst_t is None or not self._is_float(dst_t):
                continue
            consumers = [view.input_vertex(dst, port) for q, dst, port in view.consumers[node] if q == 0]
            if consumers and all(c in allow for c in consumers):
                self._allow(dst_t, EXISTING_CAST, consumers[0])


def _can_force(view: GraphView, node: int) -> bool:
    """UNSAFE_FORCE_ALL spares Const, SoftmaxCrossEntropyWithLogits, stateful and ref ops."""
    op_def = view.op_defs[node]
    if op_def is None or view.ops[node] in ("Const", "SoftmaxCrossEntropyWithLogits"):
        return False
    if op_def.is_stateful:
        return False
    return not any(arg.is_ref for arg in list(op_def.input_arg) + list(op_def.output_arg))


def _reads_reference_variable(view: GraphView, node: int) -> bool:
    """An Identity of a (non-resource) Variable, or an Enter chain over one."""
    op = view.ops[node]
    seen = 0
    while op in ("Identity", "Enter") and seen < 10000:
        source = view.regular_input_node(node, 0)
        if source is None:
            return False
        source_op = view.ops[source]
        if op == "Identity":
            return source_op in ("Variable", "VariableV2")
        node, op, seen = source, source_op, seen + 1
    return False


def rules_for(compat: str, dtype: str = "float16", force_all: bool = False) -> PaintRules:
    """The PaintRules of a ``compat`` name (see op_lists.COMPATS) and target dtype.

    Infer-after-allow (P4) arrived for bfloat16 (oneDNN) first; TF 2.15 applies it there
    only, newer TensorFlow in every mode.
    """
    if compat == "tf1.15":
        return PaintRules(infer_after_allow=False, remove_unsupported_allow=False,
                          data_structures="stack_tensor_array", force_all=force_all)
    if compat == "tf2.15":
        return PaintRules(infer_after_allow=dtype == "bfloat16", force_all=force_all)
    return PaintRules(force_all=force_all)


"""Turns the state of one pass (eligibility, paint, applied casts) into a RewriteReport.

Each node gets one reason, chosen in this order: converted (the rule that painted its
first converted attribute), unknown op, not eligible, no float32 attribute, painted
deny, left the allow set again, and otherwise the reason its list gives.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ..dtypes import DT_FLOAT, dtype_name
from . import painter as rules
from .casts import AppliedPaint, is_variable_read
from .eligibility import EXCLUDED_BY_NAME, HalfSupport
from .graph_view import GraphView
from .op_lists import OpLists
from .painter import Paint
from .report import NodeDecision, RewriteReport

Reason = Tuple[str, str, Optional[str]]  # (rule, sentence, related node)
_OTHER_FLOATS = ("float64", "float16", "bfloat16")


def _why_nothing_to_convert(other_precision: Dict[str, int], excluded: int = 0) -> str:
    """The note for a graph with no eligible float32 allow-list op, naming the other
    precisions its allow-list ops compute in (a float64 model is left as it is), or the
    ``excluded`` float32 ones that excluding them by name (a session's heals) keeps."""
    if excluded:
        return ("every float32 allow-list op (%d) is excluded by name (nodes_to_exclude, "
                "TFAMP_REWRITE_NODES_TO_EXCLUDE, or a session's heals): nothing to convert" % excluded)
    text = "no eligible allow-list op computes in float32: nothing to convert"
    if other_precision:
        text += " (%s; the pass converts float32 only)" % ", ".join(
            "%d allow-list node(s) compute in %s" % (count, word)
            for word, count in sorted(other_precision.items()))
    return text


class ReportBuilder:
    """Builds the report of one pass; ``build(report)`` fills its counters and decisions."""

    def __init__(self, view: GraphView, lists: OpLists, eligible: Sequence[bool],
                 ineligible_reasons: Sequence[Optional[str]], half: HalfSupport,
                 paint: Paint, applied: AppliedPaint, target_dtype: int):
        self.view = view
        self.lists = lists
        self.eligible = eligible
        self.ineligible_reasons = ineligible_reasons
        self.half = half
        self.paint = paint
        self.applied = applied
        self.word = dtype_name(target_dtype)
        self._categories: Dict[str, Optional[str]] = {}

    def build(self, report: RewriteReport) -> RewriteReport:
        view = self.view
        report.nodes_total = len(view.nodes)
        other_precision: Dict[str, int] = {}  # eligible allow-list nodes with no float32 type
        float32_allow = excluded_allow = 0
        for node in range(len(view.nodes)):
            floats = self._float_vertices(node)
            decision = self.decide(node, floats)
            if decision.category == "allow" and self.ineligible_reasons[node] == EXCLUDED_BY_NAME:
                excluded_allow += bool(floats)
            if decision.category == "allow" and self.eligible[node]:
                float32_allow += bool(floats)
                for word in () if floats else self._other_float_types(node):
                    other_precision[word] = other_precision.get(word, 0) + 1
            report.decisions.append(decision)
            counts = report.op_counts.setdefault(decision.op, {"total": 0, "converted": 0})
            counts["total"] += 1
            if self.eligible[node]:
                report.nodes_processable += 1
                if floats and decision.category in ("allow", "infer", "clear"):
                    report.nodes_recognized += 1
                if floats and decision.category == "deny":
                    report.deny_nodes_blocking += 1
            if decision.converted:
                counts["converted"] += 1
                report.nodes_converted += 1
                if decision.category == "allow":
                    report.allow_nodes_converted += 1
            elif decision.rule == rules.DENY_PATH:
                report.nodes_blocked_by_deny += 1
        for cast in self.applied.casts:
            report.casts.append(cast)
            if cast.to_dtype == "float32":
                report.casts_to_float += 1
            else:
                report.casts_to_half += 1
                if not is_variable_read(view, view.index[cast.source]):
                    report.casts_to_half_excluding_constants += 1
        report.casts_added = len(self.applied.casts)
        if self.paint.nothing_to_do or not (float32_allow or report.nodes_converted):
            report.nothing_converted_because = _why_nothing_to_convert(other_precision, excluded_allow)
            report.notes.append(report.nothing_converted_because)
        unknown = sorted({view.ops[i] for i, op_def in enumerate(view.op_defs) if op_def is None})
        if unknown:
            report.notes.append("unknown op type(s) kept as float32 boundaries: " + ", ".join(unknown))
        return report

    # -- one node -------------------------------------------------------------------
    def decide(self, node: int, floats: Optional[List[int]] = None) -> NodeDecision:
        """The decision for one node (``floats``: its float32 type-attribute vertices)."""
        view = self.view
        op = view.ops[node]
        if floats is None:
            floats = self._float_vertices(node)
        category = self._categories.get(op, False)
        if category is False:
            category = self._categories[op] = self.lists.category(op)
        converted = node in self.applied.converted_nodes
        rule, reason, related = self._reason(node, category, converted, floats)
        return NodeDecision(name=view.nodes[node].name, op=op,
                            dtype=self._dtype_after(node, converted, floats), reason=reason,
                            category=category, converted=converted, related=related, rule=rule)

    def _float_vertices(self, node: int) -> List[int]:
        view = self.view
        dtypes, attrs = view.vertex_dtype, view.vertex_attr
        return [v for v in view.vertices[node].values() if dtypes[v] == DT_FLOAT and attrs[v][0]]

    def _other_float_types(self, node: int) -> List[str]:
        """The floating types other than float32 a node's type attributes hold."""
        view = self.view
        words = {dtype_name(view.vertex_dtype[v]) for v in view.vertices[node].values()}
        return sorted(word for word in words if word in _OTHER_FLOATS)

    def _dtype_after(self, node: int, converted: bool, floats: List[int]) -> str:
        if converted:
            return self.word
        view = self.view
        if floats:
            return "float32"
        for vertex in view.vertices[node].values():
            if view.vertex_attr[vertex][0]:
                return dtype_name(view.vertex_dtype[vertex])
        return ""

    def _allow_listed(self, vertex: Optional[int]) -> bool:
        return vertex is not None and self.view.ops[self.view.vertex_node[vertex]] in self.lists.allow

    def _name(self, vertex: Optional[int]) -> Optional[str]:
        if vertex is None:
            return None
        return self.view.nodes[self.view.vertex_node[vertex]].name

    def _reason(self, node: int, category: Optional[str], converted: bool, floats: List[int]) -> Reason:
        view = self.view
        if converted:
            vertex = min(v for v in view.vertices[node].values() if v in self.applied.converted_vertices)
            return self._allow_reason(vertex, category)
        if view.op_defs[node] is None:
            return ("unknown_op", "unknown op %r (no OpDef in this TensorFlow or the graph's "
                    "library): kept as a float32 boundary" % view.ops[node], None)
        if not self.eligible[node]:
            return ("not_eligible", self.ineligible_reasons[node] or "not eligible", None)
        if not floats:
            kinds = sorted({dtype_name(view.vertex_dtype[v]) for v in view.vertices[node].values()
                            if view.vertex_attr[v][0]})
            if kinds == ["float16"] or kinds == ["bfloat16"]:
                return ("already_half", "already %s" % kinds[0], None)
            return ("no_float", "no float32 type attribute" + (
                " (%s)" % ", ".join(kinds) if kinds else ""), None)
        vertex = floats[0]
        if vertex in self.paint.deny:
            return self._deny_reason(vertex, node)
        if vertex in self.paint.unpainted:
            return self._unpainted_reason(vertex)
        return self._unpainted_default(node, vertex, category)

    def _allow_reason(self, vertex: int, category: Optional[str]) -> Reason:
        rule, related, other = self.paint.why.get(vertex, (rules.ALLOW_LIST, None, None))
        name, other_name = self._name(related), self._name(other)
        word = self.word
        sentences = {
            rules.ALLOW_LIST: "allow list: always %s" % word,
            rules.FORCED: "UNSAFE_FORCE_ALL level converts every eligible op",
            rules.BETWEEN_ALLOW: "%s op between allow ops: downstream of %r, upstream of %r" % (
                category, name, other_name),
            rules.INFER_AFTER_ALLOW: (
                "infer op directly after allow op %r" % name if self._allow_listed(related)
                else "infer op directly after %r, an infer op painted allow the same way" % name),
            rules.CLEAR_FLOOD: "clear op connected to %s op %r through clear ops" % (word, name),
            rules.GROUP_MATCH: "same data structure as %r, which is %s" % (name, word),
            rules.LOOP_MATCH: "loop back edge matches Merge %r, which is %s" % (name, word),
            rules.EXISTING_CAST: "existing Cast now casts to %s: all its consumers are %s (e.g. %r)" % (
                word, word, name),
        }
        return (rule, sentences.get(rule, rule), name)

    def _deny_reason(self, vertex: int, node: int) -> Reason:
        rule, related, _ = self.paint.why.get(vertex, (rules.DENY_LIST, None, None))
        name = self._name(related)
        view = self.view
        if rule == rules.DENY_LIST:
            return (rule, "deny list: kept float32 for numerical safety", None)
        if rule == rules.DENY_PATH:
            root = view.vertex_node[related]
            return (rule, "on a deny path from %r (%s, deny)" % (name, view.ops[root]), name)
        if rule == rules.GROUP_UNSAFE:
            return (rule, self.paint.group_notes.get(vertex, "unsafe data-structure group"), None)
        return (rule, "same data structure as %r, which must stay float32" % name, name)

    def _unpainted_reason(self, vertex: int) -> Reason:
        rule, related, _ = self.paint.unpainted[vertex]
        name = self._name(related)
        if rule == rules.LOOP_MISMATCH:
            return (rule, "loop colour match: %r on the same loop back edge stays float32" % name, name)
        return (rule, "the OpDef does not allow %s for this attribute" % self.word, None)

    def _unpainted_default(self, node: int, vertex: int, category: Optional[str]) -> Reason:
        view = self.view
        op = view.ops[node]
        if category is None:
            return ("unlisted", "%s is in no op list: kept float32" % op, None)
        if category == "deny":
            return (rules.DENY_LIST, "deny list: kept float32 for numerical safety", None)
        if not self.half.opdef_allows(vertex):
            return ("no_half_opdef", "the OpDef of %s does not allow %s" % (op, self.word), None)
        if not self.half.supports(vertex):
            return ("no_half_kernel", "no %s %s kernel registered for %s" % (
                self.word, self.half.kernel_device, op), None)
        if category == "clear":
            if rules._reads_reference_variable(view, node):
                return ("reads_variable", "reads a reference variable (Identity of VariableV2): "
                        "kept float32 as TensorFlow does", None)
            return ("clear_unconnected", "clear op not connected to a %s op through clear ops" % self.word,
                    None)
        if category == "allow":
            return ("allow_not_converted", "allow op left float32", None)
        return ("infer_not_between", "infer op not between allow ops", None)

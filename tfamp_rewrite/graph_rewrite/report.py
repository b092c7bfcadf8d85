"""The rewrite's report: data first (dataclasses -> JSON), sentences only in ``summary()``.

``RewriteReport`` holds the pass-summary counters NVIDIA's TF 1.15 builds printed, per-op
counts, every Cast added, one ``NodeDecision`` per node (its dtype after the rewrite
and the reason, naming the related node when the reason refers to one, so a chain of
reasons can be followed), and one ``FunctionReport`` per function of the library.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional

from .casts import CastInfo

if TYPE_CHECKING:
    from .emulation import EmulationReport
    from .tensor_cores import TensorCoreReport


@dataclass
class NodeDecision:
    """Why one node has the dtype it has after the rewrite."""

    name: str
    op: str
    dtype: str
    reason: str
    category: Optional[str] = None   # allow / infer / deny / clear / None (unlisted)
    converted: bool = False
    related: Optional[str] = None    # the node the reason refers to, if any
    rule: str = ""                   # machine-readable form of the reason


@dataclass
class FunctionReport:
    """What happened to one function of the graph's library."""

    name: str
    status: str                      # "rewritten" or "untouched"
    reason: str = ""
    report: Optional["RewriteReport"] = None


@dataclass
class RewriteReport:
    """Every decision of one rewrite (see module docstring)."""

    dtype: str
    target: str
    compat: str
    nodes_total: int = 0
    nodes_processable: int = 0
    nodes_recognized: int = 0
    nodes_converted: int = 0
    casts_added: int = 0
    casts_to_half: int = 0
    casts_to_float: int = 0
    casts_to_half_excluding_constants: int = 0
    allow_nodes_converted: int = 0
    deny_nodes_blocking: int = 0
    nodes_blocked_by_deny: int = 0
    op_counts: Dict[str, Dict[str, int]] = field(default_factory=dict)
    casts: List[CastInfo] = field(default_factory=list)
    decisions: List[NodeDecision] = field(default_factory=list)
    functions: List[FunctionReport] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    # Why the pass converted nothing, when it found no float32 allow-list op to start from.
    nothing_converted_because: Optional[str] = None
    # Probable mistakes in the settings (a misspelled environment variable or op type).
    warnings: List[str] = field(default_factory=list)
    # FLOP share in half and multiple-of-8 diagnostics; filled by tensor_cores.diagnose
    # (it needs static shapes, so the pass itself leaves it None; the command line fills it).
    tensor_cores: Optional["TensorCoreReport"] = None
    # "native": half nodes run half kernels; "emulate": float32 kernels on values rounded
    # to half, whose Casts ``emulation`` counts (the decisions above are the same).
    numerics: str = "native"
    emulation: Optional["EmulationReport"] = None

    def to_dict(self) -> dict:
        """A JSON-ready dict (nested function reports included)."""
        return asdict(self)

    def decision(self, name: str) -> NodeDecision:
        """The decision for node ``name`` (KeyError if the graph has no such node)."""
        for decision in self.decisions:
            if decision.name == name:
                return decision
        raise KeyError("no node named %r in the report" % name)

    def one_line(self) -> str:
        """The rewrite in one line, as NVIDIA's pass logs it, with the settings that made it
        (and why nothing was converted, when nothing was)."""
        line = ("converted %d of %d eligible nodes (%d in all) to %s using %d cast(s) to %s "
                "(excluding Const and Variable casts); compat=%s target=%s numerics=%s" % (
                    self.nodes_converted, self.nodes_processable, self.nodes_total, self.dtype,
                    self.casts_to_half_excluding_constants, self.dtype, self.compat, self.target,
                    self.numerics))
        if self.nothing_converted_because:
            line += "; " + self.nothing_converted_because
        if self.emulation is not None and self.emulation.native_half_nodes:
            line += ("; %d node(s) already in half in the graph run native half kernels, not "
                     "emulated" % self.emulation.native_half_nodes)
        return line

    def summary(self, max_op_rows: int = 40) -> str:
        """NVIDIA's pass-summary fields, TensorFlow's one-line log, counts per op type, Tensor Cores."""
        word = self.dtype.replace("float", "FP")
        lines = [
            "tfamp_rewrite pass summary (%s, target=%s, compat=%s)" % (self.dtype, self.target, self.compat),
            "  Total processable nodes:                        %d" % self.nodes_processable,
            "  Recognized nodes available for conversion:      %d" % self.nodes_recognized,
            "  Total nodes converted:                          %d" % self.nodes_converted,
            "  Total %s Cast ops used:%s%d (%d to %s, %d to float32)" % (
                word, " " * (27 - len(word)), self.casts_added, self.casts_to_half, self.dtype,
                self.casts_to_float),
            "  Allow-list nodes converted:                     %d" % self.allow_nodes_converted,
            "  Deny-list nodes blocking conversion:            %d" % self.deny_nodes_blocking,
            "  Nodes blocked from conversion by deny-list nodes: %d" % self.nodes_blocked_by_deny,
            "Converted %d/%d nodes to %s precision using %d cast(s) to %s "
            "(excluding Const and Variable casts)" % (
                self.nodes_converted, self.nodes_total, self.dtype,
                self.casts_to_half_excluding_constants, self.dtype),
        ]
        rows = sorted(self.op_counts.items(),
                      key=lambda item: (-item[1]["converted"], -item[1]["total"], item[0]))
        if rows:
            lines.append("  %-32s %7s %9s" % ("op type", "nodes", "converted"))
            for op, counts in rows[:max_op_rows]:
                lines.append("  %-32s %7d %9d" % (op, counts["total"], counts["converted"]))
            if len(rows) > max_op_rows:
                lines.append("  ... %d more op types" % (len(rows) - max_op_rows))
        for function in self.functions:
            if function.report is not None:
                lines.append("  function %s: %s, %d node(s) converted, %d cast(s)" % (
                    function.name, function.status, function.report.nodes_converted,
                    function.report.casts_added))
            else:
                lines.append("  function %s: %s (%s)" % (function.name, function.status, function.reason))
        if self.emulation is not None:
            lines.append("  numerics: emulated -- %d node(s) run float32 kernels on values rounded to %s "
                         "(%d rounding Cast pair(s)%s, %d widening Cast(s))" % (
                             self.emulation.nodes, self.dtype, self.emulation.rounding_casts,
                             ", rounding by %d RoundToHalf op(s) now" % self.emulation.rounding_ops
                             if self.emulation.rounding_ops else "", self.emulation.widening_casts))
        lines.extend("  note: " + note for note in self.notes)
        lines.extend("  warning: " + warning for warning in self.warnings)
        if self.tensor_cores is not None:
            lines.extend(self.tensor_cores.summary_lines())
        return "\n".join(lines)


def json_safe(value):
    """A report's ``to_dict()`` with inf/nan floats as None (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value

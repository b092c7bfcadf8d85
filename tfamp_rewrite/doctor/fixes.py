"""Which nodes must stay float32, and the list edit that keeps them there: ``find_risks``.

A tensor is *at risk* when, held in half at the scale its role gets (forward values:
1; gradients: the loss scale asked about), more than ``overflow_threshold`` of its
non-zero values overflow, or more than ``flush_threshold`` flush to zero ("mostly
flush").  Every node that holds it in half must then stay float32 -- its producer, if
converted, and its converted readers, which would otherwise read it through a Cast to
half and lose it there.  ``Fix`` says how, three ways:

* the deny-list edit (``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_<LIST>_REMOVE=Op`` plus
  ``..._DENYLIST_ADD=Op``; an op may be in one list only), which also keeps the ops
  downstream of them float32 along deny paths -- what sessions and ``tfamp-run`` read;
* the same as ``lists=`` for ``rewrite_graph_def`` / ``Session``;
* the narrow one, those nodes alone: ``tfamp-rewrite convert --nodes-to-exclude``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from ..graph_rewrite.emulation import VALUE_PRESERVING_OPS
from .limits import HalfLimits
from .probes import INTEGER_RESULTS, HalfNode
from .ranges import TensorRange

ENV_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"
_LIST_ENV = {"allow": "ALLOWLIST", "infer": "INFERLIST", "clear": "CLEARLIST", "deny": "DENYLIST"}
OVERFLOW, UNDERFLOW = "overflow", "underflow"
DEFAULT_OVERFLOW_THRESHOLD = 0.0   # any overflow
DEFAULT_FLUSH_THRESHOLD = 0.5      # most non-zero values flush to zero


@dataclass
class Fix:
    """How to keep ``nodes`` in float32."""

    nodes: List[str]
    env: str                              # the deny-list edit, as environment variables
    lists: Dict[str, List[str]]           # the same edit for lists=
    nodes_to_exclude: List[str]           # regular expressions naming exactly these nodes


@dataclass
class Risk:
    """One tensor that overflows or mostly flushes in half, and how to keep it float32."""

    kind: str                             # overflow / underflow
    tensor: str
    node: str
    op: str
    category: Optional[str]
    role: str
    fraction: float                       # of its non-zero values
    entire: bool                          # every non-zero value overflows / flushes
    scale: float                          # the scale it was judged at (gradients)
    max_abs: float
    min_abs_nonzero: Optional[float]
    half_nodes: List[HalfNode] = field(default_factory=list)
    fix: Optional[Fix] = None

    def sentence(self, dtype: str) -> str:
        what = ("%.3g%% of its values overflow %s (max |x| %.3g)" % (100 * self.fraction, dtype, self.max_abs)
                if self.kind == OVERFLOW else
                "%.3g%% of its non-zero values flush to zero in %s (smallest |x| %.3g)" % (
                    100 * self.fraction, dtype, self.min_abs_nonzero or 0.0))
        scaled = " at loss scale %g" % self.scale if self.scale != 1.0 else ""
        return "%s%s" % (what, scaled)


# The loss scaling's own scopes: its ops (training.loss_scale_optimizer.OWN_OPS_SCOPE) and its
# unscale group (fused_op.op), whose stock ops a server runs.
_LOSS_SCALING_SCOPE = re.compile(r"(amp_loss_scaling|unscale_and_check_finite)(_\d+)?$")


def added_by_the_plugin(name: str) -> bool:
    """Whether node ``name`` is one the session added to the user's graph (a histogram's
    finite-values filter, under a ``tfamp_`` scope) or the loss scaling built in it (its
    scale, unscale, finite check and skip cond): no edit of the user's names it."""
    return any(part.startswith("tfamp_") or _LOSS_SCALING_SCOPE.match(part) for part in name.split("/"))


def fix_for(nodes: List[HalfNode]) -> Fix:
    """The edits that keep ``nodes`` float32 (module docstring); nodes the session added
    to the user's graph are kept with the rest but named in no edit."""
    remove: Dict[str, List[str]] = {}
    deny: List[str] = []
    # a Shape kept float32 changes nothing, and listing its type would keep every shape float32
    named = [node for node in nodes if not added_by_the_plugin(node.name) and node.op not in INTEGER_RESULTS]
    # nor do the op-type edits list ops that only pass values on (an Identity, a loop's Enter,
    # a Reshape) beside ones computing them: every such node of the model would stay float32;
    # the node-level exclusion names them
    typed = [node for node in named if node.op not in VALUE_PRESERVING_OPS] or named
    for node in typed:
        if node.op in deny:
            continue
        deny.append(node.op)
        if node.category in ("allow", "infer", "clear"):
            remove.setdefault(node.category, []).append(node.op)
    lists = {"%s_remove" % category: ops for category, ops in sorted(remove.items())}
    lists["deny_add"] = deny
    env = ["%s%s_REMOVE=%s" % (ENV_PREFIX, _LIST_ENV[c], ",".join(ops)) for c, ops in sorted(remove.items())]
    env.append("%sDENYLIST_ADD=%s" % (ENV_PREFIX, ",".join(deny)))
    return Fix(nodes=[n.name for n in nodes], env=" ".join(env), lists=lists,
               nodes_to_exclude=["^%s$" % re.escape(n.name) for n in named])


def find_risks(ranges: List[TensorRange], limits: HalfLimits, scale_log2: Callable[[TensorRange], int],
               overflow_threshold: float = DEFAULT_OVERFLOW_THRESHOLD,
               flush_threshold: float = DEFAULT_FLUSH_THRESHOLD) -> List[Risk]:
    """The tensors at risk (overflow first, then underflow; the largest share first)."""
    risks = []
    for r in ranges:
        nonzero = r.nonzero
        if not nonzero or not r.half_nodes:
            continue
        shift = scale_log2(r)
        over = r.count_overflowing(limits, shift) / nonzero
        flush = r.count_below(limits.min_subnormal_log2, shift) / nonzero
        for kind, fraction, threshold in ((OVERFLOW, over, overflow_threshold),
                                          (UNDERFLOW, flush, flush_threshold)):
            if fraction > threshold:
                risks.append(Risk(kind=kind, tensor=r.tensor, node=r.node, op=r.op, category=r.category,
                                  role=r.role, fraction=fraction, entire=fraction == 1.0,
                                  scale=2.0 ** shift, max_abs=r.max_abs,
                                  min_abs_nonzero=r.min_abs_nonzero, half_nodes=list(r.half_nodes),
                                  fix=fix_for(r.half_nodes)))
                break
    risks.sort(key=lambda risk: (risk.kind != OVERFLOW, -risk.fraction, risk.tensor))
    return risks


def keep_float32(risks: List[Risk], dtype: str) -> Dict[str, str]:
    """``{node: reason}``: every node holding an at-risk tensor in half (first reason wins)."""
    kept: Dict[str, str] = {}
    for risk in risks:
        for node in risk.half_nodes:
            if node.name not in kept:
                how = "its output" if node.name == risk.node else "it reads"
                kept[node.name] = "%s %r: %s" % (how, risk.tensor, risk.sentence(dtype))
    return kept

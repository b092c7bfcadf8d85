"""Why a node has its dtype: the chain of reasons, following ``NodeDecision.related``.

``reason_chain(report, name)`` starts at the node's decision and follows the node each
reason refers to (the input on a deny path, the deny op it comes from, the allow op a
clear op was painted from, ...) until a reason refers to no other node::

    probs: float32 (root cause: 'exp', Exp, deny list)
      probs  Softmax  infer list  float32: infer op; input 'add' is float32 because it is on a deny path ...
      <- add  AddV2  infer list  float32: on a deny path from 'exp' (Exp, deny)
      <- exp  Exp  deny list  float32: deny list: kept float32 for numerical safety
"""
from __future__ import annotations

import difflib
from typing import List

from ..errors import ConversionError
from ..graph_rewrite.report import NodeDecision, RewriteReport


def reason_chain(report: RewriteReport, name: str) -> List[NodeDecision]:
    """The decisions from ``name`` along ``related`` links (no node twice)."""
    decisions = {decision.name: decision for decision in report.decisions}
    if name not in decisions:
        close = difflib.get_close_matches(name, list(decisions), n=3)
        raise ConversionError("the graph has no node %r" % name,
                              ("Nodes with similar names: %s" % ", ".join(close)) if close else
                              "List the nodes with --all-nodes")
    chain = [decisions[name]]
    while chain[-1].related and chain[-1].related in decisions:
        following = decisions[chain[-1].related]
        if following in chain:
            break
        chain.append(following)
    return chain


def format_chain(chain: List[NodeDecision]) -> str:
    """The chain as text: a headline, then one line per step (see module docstring)."""
    first, root = chain[0], chain[-1]
    headline = "%s: %s" % (first.name, first.dtype or "no float type")
    if len(chain) > 1:
        headline += " (root cause: %r, %s, %s)" % (root.name, root.op, _category(root))
    lines = [headline]
    for index, decision in enumerate(chain):
        lines.append("  %s%s  %s  %s  %s: %s" % (
            "<- " if index else "", decision.name, decision.op, _category(decision),
            decision.dtype or "-", decision.reason))
    return "\n".join(lines)


def format_decisions(report: RewriteReport) -> str:
    """One line per node: name, op, dtype and reason, aligned."""
    decisions = report.decisions
    if not decisions:
        return ""
    width_name = min(48, max(len(d.name) for d in decisions))
    width_op = min(28, max(len(d.op) for d in decisions))
    return "\n".join("%-*s  %-*s  %-8s  %s" % (width_name, d.name, width_op, d.op, d.dtype or "-", d.reason)
                     for d in decisions)


def _category(decision: NodeDecision) -> str:
    return "%s list" % decision.category if decision.category else "unlisted"

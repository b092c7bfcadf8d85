"""A layer's twins: the same layer under another top scope.

A DQN's target network has its online network's layers under another scope, and its Q
values come from a run that infers, which is never healed; a tower has its replica's.  When a
heal keeps a layer's node float32, the session keeps its twins float32 too (step_watch.py).
"""
from __future__ import annotations

from typing import Dict, List


def twin_nodes(graph, nodes: List[str], converted) -> List[str]:
    """The converted nodes of ``graph`` that are ``nodes``' layers under another top scope --
    a DQN's target network beside its online one, a tower beside another: the same name past
    the first scope, within a layer of it ("online/q/MatMul" and "target/q/MatMul", not
    "dense/MatMul" and "dense_1/MatMul", two layers of one model), the same op, and inputs
    of the same ops, named alike within their scopes.  A run that infers with a twin (the
    target network's Q values) is never healed, so its overflow is kept off with the node's."""
    by_tail: Dict[str, list] = {}
    for op in graph.get_operations():
        head, slash, tail = op.name.partition("/")
        if "/" in tail and op.name in converted:
            by_tail.setdefault(tail, []).append(op)
    twins = []
    for name in nodes:
        head, slash, tail = name.partition("/")
        if tail not in by_tail:
            continue
        try:
            op = graph.get_operation_by_name(name)
        except KeyError:
            continue
        twins.extend(other.name for other in by_tail[tail]
                     if other.name not in nodes and other.name not in twins and other.type == op.type
                     and _alike_inputs(op, head, other, other.name.partition("/")[0]))
    return twins


def _alike_inputs(op, head: str, other, other_head: str) -> bool:
    """Whether ``op`` (under scope ``head``) and ``other`` read the same ops, those within
    their scopes named alike there ("online/h/Relu" and "target/h/Relu")."""
    if len(op.inputs) != len(other.inputs):
        return False
    for mine, theirs in zip(op.inputs, other.inputs):
        if mine.op.type != theirs.op.type:
            return False
        inside = mine.op.name.startswith(head + "/"), theirs.op.name.startswith(other_head + "/")
        if any(inside) and (not all(inside) or mine.op.name[len(head):] != theirs.op.name[len(other_head):]):
            return False
    return True

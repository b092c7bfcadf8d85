"""Writes to non-trainable state that keep inf/nan out, in the graph a session runs.

A skipped step's forward pass may hold inf/nan: a float16 overflow the session is about to
heal.  The loss scaling skips the optimizer's update, but not the run's other writes:
batch normalization's moving averages (``UPDATE_OPS``), a MoCo queue of keys.  A moving
average never forgets a NaN, so evaluation returned NaN long after the heal.  So in the
copy of the user's graph that a rewriting session imports, when the graph holds a
loss-scaled step, each write to a non-trainable floating global variable (the loss scale's
own and metrics' local ones aside) writes finite entries only::

    Assign(v, x)                       x -> Select(IsFinite(x), x, v)
    AssignSub / AssignAdd(v, d)        d -> Select(IsFinite(d), d, ZerosLike(d))
    AssignVariableOp(h, x)             x -> Select(IsFinite(x), x, ReadVariableOp(h))
    Assign{Sub,Add}VariableOp(h, d)    d -> Select(IsFinite(d), d, ZerosLike(d))

An entry the write would make inf/nan keeps its value, where float32 would have stored it.
A write is guarded only when its value is computed through a converted node -- float16 can
overflow there; an exponential moving average of float32 weights cannot -- and a write of
a new value only when that value is also computed from the variable (a queue shifted): an
initializer or a checkpoint's restore may run before the variable holds anything to keep.
``guard_state_writes(graph_def, variables, leave, through)`` works on the rewritten GraphDef
a session imports, under names derived from each write's, so the same nodes come out at
every sync; the user's graph is not changed.
"""
from __future__ import annotations

from typing import Collection, List, Optional

from tensorflow.core.framework import types_pb2

from ..graph_rewrite.graph_view import parse_input
from .node_defs import node_def

_FLOATING = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE)
# Write op -> (its type attribute, whether it writes a delta rather than the value).
_WRITES = {"Assign": ("T", False), "AssignSub": ("T", True), "AssignAdd": ("T", True),
           "AssignVariableOp": ("dtype", False), "AssignSubVariableOp": ("dtype", True),
           "AssignAddVariableOp": ("dtype", True)}
_VARIABLE_OPS = ("VariableV2", "Variable", "VarHandleOp")
# What passes a variable (a ref or a handle) on unchanged: TF1 control flow, identities.
_PASSING = ("Identity", "RefIdentity", "Switch", "RefSwitch", "Enter", "RefEnter")
_SCOPE = "/tfamp_finite_only/"


def guard_state_writes(graph_def, variables: Collection[str], leave: Collection[str] = (),
                       through: Optional[Collection[str]] = None) -> List[str]:
    """Makes, in place, each write of ``graph_def`` to one of ``variables`` (their node
    names), other than those named in ``leave``, write finite entries only -- with
    ``through`` (node names: the converted ones), only a write whose value is computed
    through one of them; returns the writes' names."""
    by_name = {node.name: node for node in graph_def.node}
    downstream = None if through is None else _computed_from(graph_def, through)
    guarded = []
    for node in list(graph_def.node):
        kind = _WRITES.get(node.op)
        if kind is None or node.name in leave or len(node.input) < 2 or node.input[1].startswith("^"):
            continue
        type_attr, delta = kind
        dtype = node.attr[type_attr].type
        variable = _variable_of(node.input[0], by_name)
        if dtype not in _FLOATING or variable not in variables or (
                downstream is not None and parse_input(node.input[1])[0] not in downstream):
            continue
        if not delta and (not _reads(node.input[1], variable, by_name) or (
                "validate_shape" in node.attr and not node.attr["validate_shape"].b)):
            continue  # an initializer or a restore (it may run first), or another shape
        scope = node.name + _SCOPE
        value = node.input[1]
        added = [node_def(scope + "is_finite", "IsFinite", [value], T=dtype)]
        if delta:
            added.append(node_def(scope + "unchanged", "ZerosLike", [value], T=dtype))
        elif node.op == "Assign":
            added.append(node_def(scope + "unchanged", "Identity", [node.input[0]], T=dtype))
        else:
            added.append(node_def(scope + "unchanged", "ReadVariableOp", [node.input[0]], dtype=dtype))
        added.append(node_def(scope + "finite_only", "Select",
                              [scope + "is_finite", value, scope + "unchanged"], T=dtype))
        for each in added:
            each.device = node.device
        graph_def.node.extend(added)
        node.input[1] = scope + "finite_only"
        guarded.append(node.name)
    return guarded


def _variable_of(text: str, by_name) -> Optional[str]:
    """The variable node a write's first input (a ref or a handle) comes from, or None."""
    node = by_name.get(parse_input(text)[0])
    while node is not None and node.op in _PASSING and node.input:
        node = by_name.get(parse_input(node.input[0])[0])
    return node.name if node is not None and node.op in _VARIABLE_OPS else None


def _reads(text: str, variable: str, by_name) -> bool:
    """Whether the value ``text`` is computed from ``variable``'s node, through data inputs."""
    stack, seen = [parse_input(text)[0]], set()
    while stack:
        name = stack.pop()
        if name == variable:
            return True
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        stack.extend(parse_input(i)[0] for i in by_name[name].input if not i.startswith("^"))
    return False


def _computed_from(graph_def, names: Collection[str]) -> set:
    """The nodes of ``graph_def`` computed from those named ``names``, through data inputs."""
    readers = {}
    for node in graph_def.node:
        for text in node.input:
            if not text.startswith("^"):
                readers.setdefault(parse_input(text)[0], []).append(node.name)
    stack, seen = [n for n in names], set()
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(readers.get(name, ()))
    return seen

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
    ScatterUpdate(v, i, u)             u -> Select(IsFinite(u), u, Gather(v, i))
    Scatter{Sub,Add}(v, i, u)          u -> Select(IsFinite(u), u, ZerosLike(u))
    StridedSliceAssign(v, b, e, s, x)  x -> Select(IsFinite(x), x, StridedSlice(v, b, e, s))
    (and their resource and Nd forms: a memory bank, center loss's centers, a ring buffer)

An entry the write would make inf/nan keeps its value, where float32 would have stored it.
With ``switch`` (a node name), the guard holds only while that bool placeholder keeps its
default: a session feeds it off in runs that compute no loss-scaled step, where no step is
skipped, and an inf/nan stored (a float32 exp's, or float16's, which the session watches
writes for) is stored as float32 stores it.
A write is guarded only when its value is computed through a converted node -- float16 can
overflow there; an exponential moving average of float32 weights cannot -- and a write of
a new value only when that value is also computed from the variable (a queue shifted): an
initializer or a checkpoint's restore may run before the variable holds anything to keep.
``guard_state_writes(graph_def, variables, leave, through)`` works on the rewritten GraphDef
a session imports, under names derived from each write's, so the same nodes come out at
every sync; the user's graph is not changed.
"""
from __future__ import annotations

from typing import Collection, List, Optional, Tuple

from tensorflow.core.framework import tensor_pb2, types_pb2

from ..graph_rewrite.graph_view import parse_input
from .node_defs import node_def
from .variable_check import VARIABLE_OPS

_FLOATING = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE)
DELTA, VALUE, ROWS, ND_ROWS, SLICE = "delta", "value", "rows", "nd rows", "slice"
# Write op -> (its type attribute, the input it writes, what that input is): a DELTA is added
# or subtracted (kept: 0); a VALUE replaces the variable (kept: its value), ROWS its rows at
# input 1's indices (kept: those rows), ND_ROWS its elements at input 1's indices, a SLICE
# its slice at inputs 1-3 (kept: what each of those reads now).
_WRITES = {
    "Assign": ("T", 1, VALUE), "AssignVariableOp": ("dtype", 1, VALUE),
    "AssignSub": ("T", 1, DELTA), "AssignAdd": ("T", 1, DELTA),
    "AssignSubVariableOp": ("dtype", 1, DELTA), "AssignAddVariableOp": ("dtype", 1, DELTA),
    "ScatterUpdate": ("T", 2, ROWS), "ResourceScatterUpdate": ("dtype", 2, ROWS),
    "ScatterSub": ("T", 2, DELTA), "ScatterAdd": ("T", 2, DELTA),
    "ResourceScatterSub": ("dtype", 2, DELTA), "ResourceScatterAdd": ("dtype", 2, DELTA),
    "ScatterNdUpdate": ("T", 2, ND_ROWS), "ResourceScatterNdUpdate": ("T", 2, ND_ROWS),
    "ScatterNdSub": ("T", 2, DELTA), "ScatterNdAdd": ("T", 2, DELTA),
    "ResourceScatterNdSub": ("T", 2, DELTA), "ResourceScatterNdAdd": ("T", 2, DELTA),
    "StridedSliceAssign": ("T", 4, SLICE), "ResourceStridedSliceAssign": ("T", 4, SLICE),
}
_SLICE_ATTRS = ("Index", "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                "shrink_axis_mask")
# What passes a variable (a ref or a handle) on unchanged: TF1 control flow, identities.
PASSING = ("Identity", "RefIdentity", "Switch", "RefSwitch", "Enter", "RefEnter")
WRITE_OPS = frozenset(_WRITES)


def value_input(op_type: str) -> int:
    """The input of a write op (one of ``WRITE_OPS``) holding the value it writes."""
    return _WRITES[op_type][1]


def keeping_write(write, by_name, scope: str) -> Optional[Tuple[int, int, List]]:
    """``(slot, dtype, nodes)`` to make ``write`` (a NodeDef of ``by_name``) keep what it
    would change: ``nodes`` compute it, the last named ``scope + "unchanged"``, to be
    selected instead of input ``slot``.  None for a write that is no floating one of
    ``WRITE_OPS``, or whose kept value may not exist yet or fit: a new value not computed
    from the variable (an initializer or a restore may run before it holds anything), or
    one of another shape (``validate_shape=False``)."""
    kind = _WRITES.get(write.op)
    if kind is None:
        return None
    type_attr, slot, what = kind
    if len(write.input) <= slot or write.input[slot].startswith("^"):
        return None
    dtype, value = write.attr[type_attr].type, write.input[slot]
    if dtype not in _FLOATING:
        return None
    if what == VALUE and (not _reads(value, variable_of(write.input[0], by_name), by_name) or (
            "validate_shape" in write.attr and not write.attr["validate_shape"].b)):
        return None
    return slot, dtype, _unchanged(write, scope, what, dtype, value)


_SCOPE = "/tfamp_finite_only/"


def guard_state_writes(graph_def, variables: Collection[str], leave: Collection[str] = (),
                       through: Optional[Collection[str]] = None,
                       only: Optional[Collection[str]] = None, switch: Optional[str] = None) -> List[str]:
    """Makes, in place, each write of ``graph_def`` to one of ``variables`` (their node
    names), other than those named in ``leave`` (with ``only``, of those named there),
    write finite entries only -- with ``through`` (node names: the converted ones), only a
    write whose value is computed through one of them; with ``switch``, only while the
    placeholder of that name is not fed True (module docstring); returns the writes' names."""
    by_name = {node.name: node for node in graph_def.node}
    downstream = None if through is None else _computed_from(graph_def, through)
    guarded = []
    for node in list(graph_def.node):
        if node.op not in _WRITES or node.name in leave or (only is not None and node.name not in only):
            continue
        if variable_of(node.input[0], by_name) not in variables:
            continue
        scope = node.name + _SCOPE
        keeping = keeping_write(node, by_name, scope)
        if keeping is None:
            continue
        slot, dtype, unchanged = keeping
        value = node.input[slot]
        if downstream is not None and parse_input(value)[0] not in downstream:
            continue
        added = [node_def(scope + "is_finite", "IsFinite", [value], T=dtype)] + unchanged
        condition = scope + "is_finite"
        if switch is not None:
            added.append(node_def(scope + "finite_or_off", "LogicalOr", [condition, switch]))
            condition = scope + "finite_or_off"
        write_selected(graph_def, node, (slot, dtype, added), scope, condition, "finite_only")
        guarded.append(node.name)
    if guarded and switch is not None and switch not in by_name:
        graph_def.node.extend(_switch(switch))
    return guarded


def _switch(name: str) -> List:
    """A bool scalar placeholder ``name``, False unless fed."""
    value = tensor_pb2.TensorProto(dtype=types_pb2.DT_BOOL, bool_val=[False])
    value.tensor_shape.SetInParent()
    default = node_def(name + "/default", "Const", [], value=value)
    placeholder = node_def(name, "PlaceholderWithDefault", [default.name], dtype=types_pb2.DT_BOOL)
    placeholder.attr["shape"].shape.SetInParent()
    return [default, placeholder]


def write_selected(graph_def, write, keeping, scope: str, condition: str, name: str) -> None:
    """Makes, in place, ``write`` store ``Select(condition, its value, what it keeps)``, a
    node ``scope + name``: ``keeping`` is ``keeping_write``'s ``(slot, dtype, nodes)``, its
    nodes extended with those computing ``condition``; all are added on the write's device."""
    slot, dtype, added = keeping
    added = added + [node_def(scope + name, "Select", [condition, write.input[slot], scope + "unchanged"],
                              T=dtype)]
    for each in added:
        each.device = write.device
    graph_def.node.extend(added)
    write.input[slot] = scope + name


def _unchanged(write, scope: str, what: str, dtype: int, value: str) -> List:
    """The nodes computing what ``write`` leaves where its value is not finite, the last
    one named ``scope + "unchanged"``."""
    name = scope + "unchanged"
    resource = write.op.startswith("Resource") or write.op.endswith("VariableOp")
    target = write.input[0]
    if what == DELTA:
        return [node_def(name, "ZerosLike", [value], T=dtype)]
    if what == VALUE:
        return [node_def(name, "ReadVariableOp", [target], dtype=dtype) if resource
                else node_def(name, "Identity", [target], T=dtype)]
    if what == SLICE:
        nodes = [node_def(scope + "read", "ReadVariableOp", [target], dtype=dtype)] if resource else []
        sliced = node_def(name, "StridedSlice", [nodes[0].name if nodes else target]
                          + list(write.input[1:4]), T=dtype)
        for attr in _SLICE_ATTRS:
            sliced.attr[attr].CopyFrom(write.attr[attr])
        return nodes + [sliced]
    gather = {ROWS: "Gather", ND_ROWS: "GatherNd"}[what]
    index_type = write.attr["Tindices"].type
    if resource:
        return [node_def(name, "Resource" + gather, [target, write.input[1]], dtype=dtype,
                         Tindices=index_type)]
    return [node_def(name, gather, [target, write.input[1]], Tparams=dtype, Tindices=index_type)]


def variable_of(text: str, by_name) -> Optional[str]:
    """The variable node a write's first input (a ref or a handle; NodeDefs ``by_name``)
    comes from, past ``PASSING``, or None."""
    node = by_name.get(parse_input(text)[0])
    while node is not None and node.op in PASSING and node.input:
        node = by_name.get(parse_input(node.input[0])[0])
    return node.name if node is not None and node.op in VARIABLE_OPS else None


def variable_op(handle):
    """The op a write's first input (a ref or a handle; a tf.Tensor) comes from, past
    identities and TF1 control flow's switches and enters (``PASSING``)."""
    op = handle.op
    while op.type in PASSING and op.inputs:
        op = op.inputs[0].op
    return op


def written_variable(write) -> Optional[str]:
    """The name of the variable the write op ``write`` (a tf.Operation) writes, or None."""
    op = variable_op(write.inputs[0])
    return op.name if op.type in VARIABLE_OPS else None


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

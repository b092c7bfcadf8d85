"""Unscale-and-check as stock TensorFlow ops that a session's copy of the graph fuses.

A graph a user saves (``Saver``'s ``.meta``, ``export_meta_graph``, a SavedModel,
``write_graph``) must load in any TensorFlow -- TF Serving, a plain float32 process -- where
the ``UnscaleAndCheckFinite`` op is not registered.  So the loss-scale optimizer builds its
unscale and finite check from stock ops, one group per device of the gradients, and the
sessions that run the mixed-precision rewrite swap the fused op in, in the copy of the graph
they run (as Grappler optimises a copy and never the user's graph).  Both forms compute
the same bits; a session that does not rewrite runs the stock ops.

A group, under its own name scope ``S/`` (``N`` gradients)::

    S/inv_scale      = Identity(inv_scale)
    S/is_finite_<i>  = IsFinite(grad_i)                    # reads the gradient itself
    S/unscaled_<i>   = grad_i * inv_scale                  # float32 gradient
                     | Cast(Cast(grad_i, float32) * inv_scale, dtype)   # float16, bfloat16
    S/all_finite     = All(Pack([All(S/is_finite_<i>)]))   # attribute _tfamp_fusable_unscale: N

``fuse_unscale_groups`` turns each group of a GraphDef into ``S/fused`` (the op, on the
group's device, reading the gradients and ``S/inv_scale``): ``S/unscaled_<i>`` and
``S/all_finite`` become Identities of its outputs, under their own names, and the group's
other nodes go, so each gradient is read by the op alone and may be rewritten in place.
Names inside a group are relative to its scope, so a graph imported under a prefix fuses
too.  A group that no longer has this shape (edited by hand, or read from outside) is left
as stock ops and named in the result.
"""
from __future__ import annotations

import collections
import contextlib
from typing import Dict, List, Tuple

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, node_def_pb2, types_pb2

OP_TYPE = "UnscaleAndCheckFinite"
MARKER_ATTR = "_tfamp_fusable_unscale"
_FLAG = "all_finite"
_INV_SCALE = "inv_scale"
_FUSED = "fused"
_IS_FINITE = "is_finite_%d"
_UNSCALED = "unscaled_%d"

_tf = tf.compat.v1


def unscale_with_stock_ops(values, inv_scale):
    """``(unscaled, all_finite)`` for dense ``values`` (float16, float32 or bfloat16 tensors)
    and a scalar float32 ``inv_scale``: one marked group per device of the values."""
    return per_device(values, lambda group: _group(group, inv_scale))


def per_device(values, unscale_group):
    """``(unscaled, all_finite)`` from ``unscale_group(values of one device) -> (unscaled,
    flag)``, called under each device the values are on; the devices' flags ANDed."""
    by_device = collections.OrderedDict()
    for i, value in enumerate(values):
        by_device.setdefault(tf.DeviceSpec.from_string(value.device or "").to_string(), []).append(i)
    unscaled = [None] * len(values)
    flags = []
    for device, indices in by_device.items():
        with tf.device(device) if device else contextlib.nullcontext():
            outputs, flag = unscale_group([values[i] for i in indices])
        for i, output in zip(indices, outputs):
            unscaled[i] = output
        flags.append(flag)
    return unscaled, flags[0] if len(flags) == 1 else _tf.reduce_all(tf.stack(flags))


def _group(values, inv_scale):
    """One marked group (see the module docstring) for ``values``."""
    with _tf.name_scope("group"):
        inv_scale = tf.identity(inv_scale, name=_INV_SCALE)
        finite = [_tf.reduce_all(_tf.is_finite(v, name=_IS_FINITE % i)) for i, v in enumerate(values)]
        flag = _tf.reduce_all(tf.stack(finite), name=_FLAG)
        unscaled = []
        for i, v in enumerate(values):
            if v.dtype == tf.float32:
                unscaled.append(tf.multiply(v, inv_scale, name=_UNSCALED % i))
            else:
                unscaled.append(tf.cast(tf.cast(v, tf.float32) * inv_scale, v.dtype, name=_UNSCALED % i))
    if not tf.executing_eagerly():  # eager values have no graph to fuse
        flag.op._set_attr(MARKER_ATTR, attr_value_pb2.AttrValue(i=len(values)))
    return unscaled, flag


def fuse_unscale_groups(graph_def) -> Tuple[List[str], Dict[str, str]]:
    """Replaces, in place, each marked group of ``graph_def`` by the fused op (module
    docstring).  Returns the scopes of the groups fused, and ``{scope: why}`` for those left
    as stock ops."""
    nodes = {node.name: node for node in graph_def.node}
    fused, left = [], {}
    to_remove = set()
    for flag in [node for node in graph_def.node if MARKER_ATTR in node.attr]:
        scope = flag.name[:-len(_FLAG)]
        problem = _shape_problem(flag, scope, nodes)
        members = {name for name in nodes if name.startswith(scope)} if not problem else set()
        removed = members - _kept_names(scope, flag.attr[MARKER_ATTR].i)
        problem = problem or _read_from_outside(graph_def, removed, members)
        if problem:
            left[scope] = problem
            continue
        _fuse(graph_def, flag, scope, nodes, removed)
        to_remove |= removed
        fused.append(scope)
    if to_remove:
        kept = [node for node in graph_def.node if node.name not in to_remove]
        del graph_def.node[:]
        graph_def.node.extend(kept)
    return fused, left


def _kept_names(scope: str, count: int) -> set:
    return ({scope + _FLAG, scope + _INV_SCALE}
            | {scope + _UNSCALED % i for i in range(count)})


def _shape_problem(flag, scope: str, nodes) -> str:
    """Why the group of ``flag`` cannot be fused, or ''."""
    count = flag.attr[MARKER_ATTR].i
    if not flag.name.endswith("/" + _FLAG) or flag.op != "All" or count < 1:
        return "its flag %s is not a group's" % flag.name
    if scope + _FUSED in nodes:
        return "%s exists already" % (scope + _FUSED)
    expected = [(scope + _INV_SCALE, ("Identity",))]
    for i in range(count):
        expected += [(scope + _IS_FINITE % i, ("IsFinite",)), (scope + _UNSCALED % i, ("Mul", "Cast"))]
    for name, ops in expected:
        if name not in nodes or nodes[name].op not in ops:
            return "%s is not a %s node" % (name, " or ".join(ops))
    return ""


def _read_from_outside(graph_def, removed: set, members: set) -> str:
    """Why removing ``removed`` would break a node outside the group, or ''."""
    for node in graph_def.node:
        if node.name in members:
            continue
        for text in node.input:
            if _node_name(text) in removed and node.op in ("Switch", "RefSwitch", "Merge", "Enter"):
                return ("apply_gradients was called inside TF1 control flow (a tf.cond or while "
                        "loop of the program's), whose '%s' reads the check's value '%s'"
                        % (node.name, text))
            if _node_name(text) in removed:
                return "'%s' reads the check's value '%s'" % (node.name, text)
    return ""


def _fuse(graph_def, flag, scope: str, nodes, removed: set) -> None:
    count = flag.attr[MARKER_ATTR].i
    readers = [nodes[scope + _IS_FINITE % i] for i in range(count)]
    fused = node_def_pb2.NodeDef(name=scope + _FUSED, op=OP_TYPE, device=flag.device)
    fused.input.extend([reader.input[0] for reader in readers] + [scope + _INV_SCALE])
    fused.attr["T"].list.type.extend([reader.attr["T"].type for reader in readers])
    # Control inputs the group's nodes had from outside it (a control_dependencies block).
    outside_controls = sorted({text for name in removed for text in nodes[name].input
                               if text.startswith("^") and _node_name(text) not in removed})
    fused.input.extend(outside_controls)
    for i, reader in enumerate(readers):
        _become_identity(nodes[scope + _UNSCALED % i], "%s:%d" % (fused.name, i), reader.attr["T"].type,
                         removed)
    _become_identity(flag, "%s:%d" % (fused.name, count), types_pb2.DT_BOOL, removed)
    graph_def.node.extend([fused])


def _become_identity(node, source: str, dtype, removed: set) -> None:
    """Turns ``node`` into ``Identity(source)`` of ``dtype``, keeping its name, device and
    its control inputs on nodes not ``removed``."""
    controls = [text for text in node.input if text.startswith("^") and _node_name(text) not in removed]
    node.op = "Identity"
    del node.input[:]
    node.input.extend([source] + controls)
    node.attr.clear()
    node.attr["T"].type = dtype


def _node_name(text: str) -> str:
    """The node an input string (``"x"``, ``"x:1"``, ``"^x"``) refers to."""
    return text.lstrip("^").split(":")[0]

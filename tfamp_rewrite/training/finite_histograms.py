"""Histogram summaries that leave non-finite values out, in the graph a session runs.

TensorFlow's ``HistogramSummary`` fails the whole run on an inf or nan ("Infinity in
Histogram").  With loss scaling, the gradients of a skipped step are inf or nan by design --
TensorFlow's own CIFAR-10 tutorial summarises each gradient as a histogram, and a first
step with the loss scale at 2**15 often overflows -- and a half activation may overflow
where float32's did not.  So in the copy of the user's graph that a rewriting session
imports, each histogram summary reads its values with the non-finite ones left out::

    flat = Reshape(values, [-1]);  kept = GatherV2(flat, Reshape(Where(IsFinite(flat)), [-1]), 0)

The user's graph is not changed; ``filter_non_finite`` works on the GraphDef taken from it,
under names derived from each summary's, so the same nodes come out at every sync.
"""
from __future__ import annotations

from typing import List

from tensorflow.core.framework import node_def_pb2, tensor_pb2, types_pb2

from ..graph_rewrite.graph_view import parse_input

_SUMMARY_OP = "HistogramSummary"
_FLOATING = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE)
_SCOPE = "/tfamp_finite_values/"


def filter_non_finite(graph_def) -> List[str]:
    """Rewires, in place, each histogram summary of ``graph_def`` to its values' finite
    elements; returns the summaries' names."""
    changed = []
    for node in list(graph_def.node):
        if node.op != _SUMMARY_OP or node.attr["T"].type not in _FLOATING:
            continue
        values = node.input[1]
        dtype = node.attr["T"].type
        scope = node.name + _SCOPE
        in_its_frame = ["^" + parse_input(values)[0]]  # a Const in a loop or cond branch needs one
        nodes = [
            _node(scope + "minus_one", "Const", in_its_frame, _int32_vector([-1])),
            _node(scope + "zero", "Const", in_its_frame, _int32_scalar(0)),
            _node(scope + "flat", "Reshape", [values, scope + "minus_one"],
                  T=dtype, Tshape=types_pb2.DT_INT32),
            _node(scope + "is_finite", "IsFinite", [scope + "flat"], T=dtype),
            _node(scope + "where", "Where", [scope + "is_finite"], T=types_pb2.DT_BOOL),
            _node(scope + "indices", "Reshape", [scope + "where", scope + "minus_one"],
                  T=types_pb2.DT_INT64, Tshape=types_pb2.DT_INT32),
            _node(scope + "kept", "GatherV2", [scope + "flat", scope + "indices", scope + "zero"],
                  Tparams=dtype, Tindices=types_pb2.DT_INT64, Taxis=types_pb2.DT_INT32, batch_dims=0),
        ]
        for added in nodes:
            added.device = node.device
        graph_def.node.extend(nodes)
        node.input[1] = scope + "kept"
        changed.append(node.name)
    return changed


def _node(name, op, inputs, value=None, **attrs):
    """A NodeDef; ``value`` (a TensorProto) makes it a Const, ``attrs`` are type attributes
    but for the integer ``batch_dims``."""
    node = node_def_pb2.NodeDef(name=name, op=op, input=inputs)
    if value is not None:
        node.attr["dtype"].type = value.dtype
        node.attr["value"].tensor.CopyFrom(value)
    for key, attr in attrs.items():
        if key == "batch_dims":
            node.attr[key].i = attr
        else:
            node.attr[key].type = attr
    return node


def _int32_vector(values):
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, int_val=values,
                                  tensor_shape={"dim": [{"size": len(values)}]})


def _int32_scalar(value):
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, int_val=[value], tensor_shape={})


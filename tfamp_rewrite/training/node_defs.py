"""NodeDefs for the small subgraphs a session adds to the GraphDef it imports.

``finite_histograms.py`` and ``check_deferral.py`` both read a tensor's values flattened:
``flattened(values, dtype, scope)`` gives ``scope + "flat"`` (a Reshape to ``[-1]``) with its
constants ``scope + "minus_one"`` and ``scope + "zero"`` (an axis), the constants made in the
values' frame -- a Const in a TF1 loop or cond branch needs a control input there.
``node_def`` builds any other node.
"""
from __future__ import annotations

from typing import List, Mapping, Optional

from tensorflow.core.framework import node_def_pb2, tensor_pb2, types_pb2

from ..graph_rewrite.graph_view import parse_input


def node_def(name: str, op: str, inputs: List[str], value=None,
             ints: Optional[Mapping[str, int]] = None, **types) -> node_def_pb2.NodeDef:
    """A NodeDef: ``value`` (a TensorProto) makes it a Const, ``ints`` are integer
    attributes, ``types`` type attributes."""
    node = node_def_pb2.NodeDef(name=name, op=op, input=inputs)
    if value is not None:
        node.attr["dtype"].type = value.dtype
        node.attr["value"].tensor.CopyFrom(value)
    for key, number in (ints or {}).items():
        node.attr[key].i = number
    for key, dtype in types.items():
        node.attr[key].type = dtype
    return node


def flattened(values: str, dtype: int, scope: str) -> List[node_def_pb2.NodeDef]:
    """``scope + "flat"``: ``values`` reshaped to one dimension, and its two constants."""
    in_its_frame = ["^" + parse_input(values)[0]]
    return [
        node_def(scope + "minus_one", "Const", in_its_frame, _int32([-1])),
        node_def(scope + "zero", "Const", in_its_frame, _int32(0)),
        node_def(scope + "flat", "Reshape", [values, scope + "minus_one"], T=dtype,
                 Tshape=types_pb2.DT_INT32),
    ]


def _int32(value):
    if isinstance(value, list):
        return tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, int_val=value,
                                      tensor_shape={"dim": [{"size": len(value)}]})
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, int_val=[value], tensor_shape={})

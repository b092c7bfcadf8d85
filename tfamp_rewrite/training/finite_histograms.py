"""Histogram summaries that leave non-finite values out, in the graph a session runs.

TensorFlow's ``HistogramSummary`` fails the whole run on an inf or nan ("Infinity in
Histogram").  With loss scaling, the gradients of a skipped step are inf or nan by design --
TensorFlow's own CIFAR-10 tutorial summarises each gradient as a histogram, and a first
step with the loss scale at 2**15 often overflows -- and a half activation may overflow
where float32's did not.  So in the copy of the user's graph that a rewriting session
imports, each histogram summary reads its values with the non-finite ones left out::

    flat = Reshape(values, [-1]);  finite = LessEqual(Abs(flat), the dtype's largest value)
    kept = GatherV2(flat, Reshape(Where(finite), [-1]), 0)

(not ``IsFinite``: Grappler's arithmetic optimizer then ran a ``tf.Print`` the values come
from twice per run -- the CIFAR-10 tutorial's printed gradient norms came out doubled).

The user's graph is not changed; ``filter_non_finite`` works on the GraphDef taken from it,
under names derived from each summary's, so the same nodes come out at every sync.
"""
from __future__ import annotations

from typing import List

import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import tensor_util

from ..graph_rewrite.graph_view import parse_input
from .node_defs import flattened, node_def

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
        largest = tensor_util.make_tensor_proto(tf.as_dtype(dtype).max, dtype=tf.as_dtype(dtype))
        nodes = flattened(values, dtype, scope) + [
            node_def(scope + "largest", "Const", ["^" + parse_input(values)[0]], largest),
            node_def(scope + "size", "Abs", [scope + "flat"], T=dtype),
            node_def(scope + "is_finite", "LessEqual", [scope + "size", scope + "largest"], T=dtype),
            node_def(scope + "where", "Where", [scope + "is_finite"], T=types_pb2.DT_BOOL),
            node_def(scope + "indices", "Reshape", [scope + "where", scope + "minus_one"],
                     T=types_pb2.DT_INT64, Tshape=types_pb2.DT_INT32),
            node_def(scope + "kept", "GatherV2", [scope + "flat", scope + "indices", scope + "zero"],
                     ints={"batch_dims": 0}, Tparams=dtype, Tindices=types_pb2.DT_INT64,
                     Taxis=types_pb2.DT_INT32),
        ]
        for added in nodes:
            added.device = node.device
        graph_def.node.extend(nodes)
        node.input[1] = scope + "kept"
        changed.append(node.name)
    return changed

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

Only histograms of values a backward pass or a node that may compute in half (an allow-list
op the session does not keep float32) lies upstream of: a histogram of float32's own
values (a weight, an activation once its layers are healed) fails the run on inf/nan as
in float32 -- TF1 programs rely on "Infinity in Histogram" to stop a diverging run.

The user's graph is not changed; ``filter_non_finite`` works on the GraphDef taken from it,
under names derived from each summary's, so the same nodes come out at every sync.
"""
from __future__ import annotations

from typing import Callable, Dict, List

import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import tensor_util

from ..graph_rewrite.graph_view import parse_input
from .node_defs import flattened, node_def
from .unscaled_training import GRADIENT_SCOPE

_SUMMARY_OP = "HistogramSummary"
_FLOATING = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE)
_SCOPE = "/tfamp_finite_values/"
_WALKING = object()


def filter_non_finite(graph_def, may_be_half: Callable[[str], bool]) -> List[str]:
    """Rewires, in place, each histogram summary of ``graph_def`` whose values may hold a
    skipped step's or a half value's inf/nan to their finite elements (module docstring);
    ``may_be_half(node)``: whether the rewrite may convert that node.  Returns the
    summaries' names."""
    changed = []
    upstream = _HalfOrBackpropUpstream(graph_def, may_be_half)
    for node in list(graph_def.node):
        if node.op != _SUMMARY_OP or node.attr["T"].type not in _FLOATING:
            continue
        if not upstream.of(parse_input(node.input[1])[0]):
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


class _HalfOrBackpropUpstream:
    """Whether a node of a GraphDef is, or is computed from, a backward pass's node or one
    ``may_be_half`` accepts; each node walked once."""

    def __init__(self, graph_def, may_be_half: Callable[[str], bool]):
        self._inputs = {node.name: [parse_input(name)[0] for name in node.input if not name.startswith("^")]
                        for node in graph_def.node}
        self._may_be_half = may_be_half
        self._known: Dict[str, object] = {}

    def of(self, name: str) -> bool:
        stack = [(name, False)]
        while stack:  # iterative, inputs first: a long chain must not recurse
            current, expanded = stack.pop()
            if expanded:
                inputs = self._inputs.get(current, ())
                self._known[current] = any(self._known.get(each) is True for each in inputs)
                continue
            if current in self._known:  # known, or on the stack (a TF1 loop's back edge)
                continue
            if GRADIENT_SCOPE.search(current) or self._may_be_half(current):
                self._known[current] = True
                continue
            self._known[current] = _WALKING
            stack.append((current, True))
            stack.extend((each, False) for each in self._inputs.get(current, ()) if each not in self._known)
        return self._known.get(name) is True

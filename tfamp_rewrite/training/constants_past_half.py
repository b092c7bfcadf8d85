"""Constants a half node would read as inf: the session keeps their readers float32.

TensorFlow's pass casts a float32 constant that a converted node reads to half.  A finite
value past half's range becomes inf there, and the result is often finite and wrong, so
nothing is ever seen to fail: a hand-written HMC's ``q + eps * p / mass`` with a mass
matrix entry of 4.4e5 divides by inf, and that coordinate never moves; ``mask * -1e9``
in half is ``0 * -inf``, nan.  The session keeps the nodes reading such a constant
float32 (as ``tfamp-rewrite convert`` does by default, ``--out-of-range keep-float32``)
and says so once per graph, naming the constants and their readers.

Only values that become inf count.  Small constants that half flushes to zero (an
``x + 1e-8`` guard) stay as TensorFlow's pass leaves them: a zero is no silent inf, and
the session's watch sees the inf/nan a flushed guard makes.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
from tensorflow.core.framework import types_pb2

from ..doctor.fixes import added_by_the_plugin
from ..graph_rewrite.graph_view import parse_input
from .devices import log_once

# The smallest magnitude each half type rounds to inf: its largest finite value plus half
# a unit in the last place (65504 + 16; bfloat16's 2**127 * (2 - 2**-7) + 2**119).
ROUNDS_TO_INF = {"float16": 65520.0, "bfloat16": 2.0 ** 127 * (2.0 - 2.0 ** -7) + 2.0 ** 119}
# Ops passing a constant's values on unchanged, and the inputs that hold them.  A Fill of a
# scalar -1e9 read in half is the scalar's inf; a gather from a table of raw features (a
# click model's incomes) passes the table's large entries on.  Kept float32, their readers
# read them next.
_VALUE_INPUTS = {"Identity": (0,), "Snapshot": (0,), "Reshape": (0,), "ExpandDims": (0,),
                 "Squeeze": (0,), "Tile": (0,), "BroadcastTo": (0,), "Transpose": (0,), "Fill": (1,),
                 "Gather": (0,), "GatherV2": (0,), "GatherNd": (0,), "Slice": (0,), "StridedSlice": (0,)}
_ALL_BUT_LAST = frozenset({"ConcatV2"})  # the axis last
_ALL = frozenset({"Pack"})
_MOST_SAID = 3
_MOST_WALKED = 64  # nodes up from a cast to the constants it passes on


class ConstantsPastHalf:
    """Per session graph: the user nodes kept float32 for reading a constant past half's range."""

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.readers: Dict[str, str] = {}  # user node kept float32 -> the constant it reads
        self._largest: Dict[str, float] = {}  # constant -> its largest finite |x|, if past

    def found_in(self, graph_def, casts) -> Dict[str, str]:
        """``{reader: constant}`` for the nodes not kept yet that read, through one of the
        rewrite's ``casts`` to half (its report's), a float32 constant past half's range."""
        nodes = {node.name: node for node in graph_def.node}
        found: Dict[str, str] = {}
        for cast in casts:
            if cast.to_dtype == "float32":
                continue
            past = [constant for constant in _constant_sources(nodes, cast.source, cast.port)
                    if self._largest_past_half(constant) is not None]
            if not past:
                continue
            for reader in cast.consumers:
                if reader not in self.readers and reader in nodes:
                    found.setdefault(reader, past[0].name)
        return found

    def keep(self, found: Dict[str, str]) -> None:
        """Keeps ``found`` float32 from now on."""
        self.readers.update(found)

    def say(self, found: Dict[str, str]) -> None:
        """Says once that ``found`` (a rewrite's, over its rounds) are kept float32, and why;
        nodes the session added (a histogram filter's bound, float32's largest value) are
        kept unsaid."""
        found = {reader: constant for reader, constant in found.items() if not added_by_the_plugin(reader)}
        if not found:
            return
        constants: Dict[str, List[str]] = {}
        for reader, constant in sorted(found.items()):
            constants.setdefault(constant, []).append(reader)
        said = "; ".join("%r (largest |x| %.4g), read by %s" % (
            constant, self._largest[constant], ", ".join(repr(r) for r in readers[:_MOST_SAID])
            + (" and %d more" % (len(readers) - _MOST_SAID) if len(readers) > _MOST_SAID else ""))
            for constant, readers in list(constants.items())[:_MOST_SAID])
        if len(constants) > _MOST_SAID:
            said += "; and %d more constant(s)" % (len(constants) - _MOST_SAID)
        log_once("tfamp_rewrite: %d constant(s) hold finite values that %s rounds to inf: %s. "
                 "Those readers stay float32, where TensorFlow's pass would read inf (x / inf "
                 "is a silent 0, 0 * inf is nan); tfamp-rewrite convert does the same by default "
                 "(--out-of-range keep-float32). To run them in %s, bring the constant into range "
                 "(said once)" % (len(constants), self.dtype, said, self.dtype))

    def _largest_past_half(self, constant):
        """The largest finite |x| of ``constant`` (a float32 Const NodeDef) if any value
        rounds to inf in half, else None; once per constant (a dataset held as one is big)."""
        if constant.name not in self._largest:
            import tensorflow as tf

            values = np.abs(tf.compat.v1.make_ndarray(constant.attr["value"].tensor))
            finite = values[np.isfinite(values)]
            self._largest[constant.name] = (
                float(finite.max()) if finite.size and finite.max() >= ROUNDS_TO_INF[self.dtype] else None)
        return self._largest[constant.name]


def _constant_sources(nodes, name: str, port: int) -> List:
    """The float32 Const NodeDefs whose values output ``port`` of ``name`` passes on
    (``_VALUE_INPUTS``, a concatenation's or a stack's inputs), at most ``_MOST_WALKED``
    nodes up."""
    found, stack, seen = [], [(name, port)], set()
    while stack and len(seen) < _MOST_WALKED:
        name, port = stack.pop()
        node = nodes.get(name)
        if node is None or port != 0 or name in seen:
            continue
        seen.add(name)
        if node.op == "Const":
            if node.attr["dtype"].type == types_pb2.DT_FLOAT:
                found.append(node)
            continue
        inputs = [text for text in node.input if not text.startswith("^")]
        if node.op in _ALL_BUT_LAST:
            passed = inputs[:-1]
        elif node.op in _ALL:
            passed = inputs
        else:
            passed = [inputs[i] for i in _VALUE_INPUTS.get(node.op, ()) if i < len(inputs)]
        stack.extend(parse_input(text) for text in passed)
    return found

"""The range of each probed tensor as in-graph reductions, fetched together with a run.

``ProbeOps(graph, limits)`` adds, per probed float32 tensor ``x`` of ``graph`` (a float16 or
bfloat16 one, as in a rewritten graph, is cast to float32 first: exactly)::

    a      = |x|
    bins   = 256 if a == 0 else float32 exponent field of a     (bitcast, shift: 0..255)
    counts = bincount(bins, 257) ++ [count(a > largest finite half value)]    # int32[258]
    extrema = [max(a), min(a where a != 0)]                                    # float32[2]

so one fetch of a few hundred integers per tensor carries its magnitude histogram (bin
``b`` holds ``2**(b-127) <= |x| < 2**(b-126)``; 0: float32 subnormals; 255: inf/nan), its
zeros and its overflows.  ``select(elements, fed)`` tells which probes a run computes
anyway (its tensors are ancestors of what it fetches, or fed values it reads), so probing never
makes a run compute more than it asked for; ``fetches(ids)`` stacks their results into
two tensors.  Both are cached: a training loop repeats the same run.

The reductions are built from a template: one probe's subgraph, made once per input dtype
and limit in a scratch graph, copied under a name prefix per probe and imported in one
``import_graph_def`` with the probed tensors mapped in.  Building ops one by one from Python
cost about 20 ms per probe (44 s for a transformer's 594 half tensors); the import costs a
small fraction of that, and the ops are the same.
"""
from __future__ import annotations

import functools
from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from .limits import HalfLimits
from .probes import Probe

tf1 = tf.compat.v1
BINS = 258          # 256 float32 exponent fields, zeros, overflows
NONFINITE_BIN = 255  # exponent field 255: inf and nan
ZERO_BIN = 256
OVERFLOW_BIN = 257
SCOPE = "tfamp_doctor/"
_MEASURABLE = (tf.float32, tf.float16, tf.bfloat16)


class ProbeOps:
    """Probe reductions in one ``tf.Graph`` (see module docstring)."""

    def __init__(self, graph: tf.Graph, limits: HalfLimits):
        self.graph = graph
        self.limits = limits
        self.probes: List[Probe] = []
        self._tensors: List[tf.Tensor] = []
        self._stats: Dict[int, Tuple[tf.Tensor, tf.Tensor]] = {}  # built on first fetch
        self._ids: Dict[str, int] = {}
        self._selections: Dict[tuple, Tuple[int, ...]] = {}
        self._bundles: Dict[Tuple[int, ...], Tuple[tf.Tensor, tf.Tensor]] = {}

    def add(self, probes: Iterable[Probe]) -> int:
        """Builds the reductions of ``probes`` not yet probed; returns how many were added."""
        added = 0
        with self.graph.as_default(), tf1.name_scope(SCOPE):
            for probe in probes:
                if probe.tensor in self._ids:
                    continue
                tensor = self.graph.get_tensor_by_name(probe.tensor)
                if tensor.dtype not in _MEASURABLE:
                    continue
                self._ids[probe.tensor] = len(self.probes)
                self.probes.append(probe)
                self._tensors.append(tensor)
                added += 1
        self._selections.clear()
        return added

    def select(self, elements: Sequence, fed: Iterable = ()) -> Tuple[int, ...]:
        """Ids of the probes whose tensors a run fetching ``elements`` computes (``fed`` aside)."""
        fed_names = frozenset(t.name for t in fed)
        key = (tuple(e.name for e in elements), fed_names)
        cached = self._selections.get(key)
        if cached is not None:
            return cached
        ancestors, fed_and_read = set(), set()
        stack = [e.op if isinstance(e, tf.Tensor) else e for e in elements]
        while stack:
            op = stack.pop()
            if op in ancestors:
                continue
            ancestors.add(op)
            for t in op.inputs:
                if t.name in fed_names:
                    fed_and_read.add(t.name)
                else:
                    stack.append(t.op)
            stack.extend(op.control_inputs)
        # A fed tensor is probed where the run reads it: the probe reads the fed value.
        selected = tuple(i for i, tensor in enumerate(self._tensors)
                         if tensor.name in fed_and_read
                         or (tensor.op in ancestors and tensor.name not in fed_names))
        self._selections[key] = selected
        return selected

    def fetches(self, ids: Tuple[int, ...]) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(counts int32[k, 258], extrema float32[k, 2])`` for the probes ``ids``, stacked."""
        bundle = self._bundles.get(ids)
        if bundle is None:
            self._build_stats([i for i in ids if i not in self._stats])
            with self.graph.as_default(), tf1.name_scope(SCOPE):
                stats = [self._stats[i] for i in ids]
                bundle = (tf1.stack([counts for counts, _ in stats], name="counts"),
                          tf1.stack([extrema for _, extrema in stats], name="extrema"))
            self._bundles[ids] = bundle
        return bundle

    def _build_stats(self, probe_ids: List[int]) -> None:
        """Adds the reductions of ``probe_ids`` to the graph in one import (module docstring)."""
        if not probe_ids:
            return
        combined = graph_pb2.GraphDef()
        input_map, returns = {}, []
        for probe_id in probe_ids:
            tensor = self._tensors[probe_id]
            template = _template(tensor.dtype.as_datatype_enum, float(self.limits.max_finite))
            prefix = "p%d/" % probe_id
            for node in template.graph_def.node:
                copy = combined.node.add()
                copy.CopyFrom(node)
                copy.name = prefix + node.name
                copy.input[:] = [("^" + prefix + name[1:]) if name.startswith("^") else prefix + name
                                 for name in node.input]
            input_map[prefix + template.input] = tensor
            returns += [prefix + template.counts, prefix + template.extrema]
        with self.graph.as_default():
            imported = tf1.import_graph_def(combined, input_map=input_map, return_elements=returns,
                                            name=SCOPE + "stats")
        for index, probe_id in enumerate(probe_ids):
            self._stats[probe_id] = (imported[2 * index], imported[2 * index + 1])


class _Template:
    """One probe's reductions as a GraphDef: its input placeholder and its two outputs."""

    def __init__(self, dtype: int, largest: float):
        graph = tf.Graph()
        with graph.as_default():
            tensor = tf1.placeholder(tf.as_dtype(dtype), name="probed")
            values = tensor if tensor.dtype == tf.float32 else tf1.cast(tensor, tf.float32)
            counts, extrema = _tensor_stats(values, largest)
        self.graph_def = graph.as_graph_def()
        self.input, self.counts, self.extrema = tensor.name, counts.name, extrema.name


@functools.lru_cache(maxsize=None)
def _template(dtype: int, largest: float) -> _Template:
    return _Template(dtype, largest)


def _tensor_stats(tensor: tf.Tensor, largest: float) -> Tuple[tf.Tensor, tf.Tensor]:
    # Few ops, and none that constant folding can turn into a tensor-sized constant (a Fill
    # of a known shape would be): the first run of a graph holding thousands of probes is
    # spent mostly in Grappler, in proportion to their nodes.
    values = tf1.abs(tf1.reshape(tensor, [-1]))
    exponents = tf1.bitwise.right_shift(tf1.bitcast(values, tf.int32), 23)  # no sign bit: 0..255
    zero = tf1.equal(values, 0.0)
    bins = tf1.where_v2(zero, ZERO_BIN, exponents)
    # the op itself: tf.math.bincount adds eight ops to size its output, known here
    histogram = tf.raw_ops.Bincount(arr=bins, size=ZERO_BIN + 1, weights=tf1.constant([], tf.int32))
    overflow = tf1.reduce_sum(tf1.cast(tf1.greater(values, largest), tf.int32), keepdims=True)
    counts = tf1.concat([histogram, overflow], 0)
    smallest = tf1.reduce_min(tf1.where_v2(zero, np.float32(np.inf), values))
    return counts, tf1.stack([tf1.reduce_max(values), smallest])

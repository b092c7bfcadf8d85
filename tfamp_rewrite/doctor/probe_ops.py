"""The range of each probed tensor as in-graph reductions, fetched together with a run.

``ProbeOps(graph, limits)`` measures, per probed float32 tensor ``x`` of ``graph`` (a float16
or bfloat16 one, as in a rewritten graph, is cast to float32 first: exactly)::

    a      = |x|
    bins   = 256 if a == 0 else float32 exponent field of a     (bitcast, shift: 0..255)
    counts = bincount(bins, 257) ++ [count(a > largest finite half value)]    # int32[258]
    extrema = [max(a), min(a where a != 0)]                                    # float32[2]

so one fetch of a few hundred integers per tensor carries its magnitude histogram (bin
``b`` holds ``2**(b-127) <= |x| < 2**(b-126)``; 0: float32 subnormals; 255: inf/nan), its
zeros and its overflows (an empty tensor's max is -inf; min is inf where no element is
non-zero).  ``select(elements,
fed)`` tells which probes a run computes anyway (its tensors are ancestors of what it
fetches, or fed values it reads), so probing never makes a run compute more than it asked
for; ``fetches(ids)`` stacks their results into two tensors.  Both are cached: a training
loop repeats the same run.

Layout.  The first run holding the probes is a new kind of run, which TensorFlow optimizes
(Grappler) and prepares once, in proportion to the graph's nodes: that pause is what a
diagnosed step costs the user, so the probes are built from few nodes.  Each probed tensor
gets its flattening (Reshape, a Cast from half, Size: a template imported for all of them
in one ``import_graph_def``, as building ops one by one from Python cost ~20 ms per probe).
Groups of up to ``GROUP_SIZE`` of them (fewer where their known sizes pass
``GROUP_ELEMENTS``, which bounds the copy a group's concatenation makes) share the
elementwise work: concatenated, their magnitudes, bins and masks are computed once, a
``SplitV`` hands each tensor its part, and each gets only its four reductions (Bincount,
Sum, Max, Min) -- about 7 nodes per probe where one template per probe took 29.  (Segment
reductions over the concatenation would need a segment id per element: a cumulative sum
or a search, which cost more than the step on a CPU.)
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
GROUP_SIZE = 64               # probed tensors reduced together
GROUP_ELEMENTS = 1 << 25      # at most this many elements known from static shapes (128 MB)


class ProbeOps:
    """Probe reductions in one ``tf.Graph`` (see module docstring)."""

    def __init__(self, graph: tf.Graph, limits: HalfLimits):
        self.graph = graph
        self.limits = limits
        self.probes: List[Probe] = []
        self._tensors: List[tf.Tensor] = []
        self._flats: Dict[int, Tuple[tf.Tensor, tf.Tensor]] = {}  # flattened, its size: built on first fetch
        self._flat_shape = None
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
                if tensor.dtype not in _MEASURABLE or tensor.shape.num_elements() == 0:
                    continue  # a static (0,) may hide a scalar (a fused batch norm gradient's reserve)
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
            self._build_flats([i for i in ids if i not in self._flats])
            largest = float(self.limits.max_finite)
            copies = []
            for group in self._groups(ids):
                template = _group_template(len(group), largest)
                inputs = {}
                for k, probe_id in enumerate(group):
                    inputs[template.flats[k]], inputs[template.sizes[k]] = self._flats[probe_id]
                copies.append((template, inputs))
            groups = _import_copies(self.graph, copies, SCOPE + "group")
            with self.graph.as_default(), tf1.name_scope(SCOPE):
                if len(groups) == 1:
                    bundle = tuple(groups[0])
                else:
                    bundle = (tf1.concat([counts for counts, _ in groups], 0, name="counts"),
                              tf1.concat([extrema for _, extrema in groups], 0, name="extrema"))
            self._bundles[ids] = bundle
        return bundle

    def _groups(self, ids: Tuple[int, ...]) -> List[List[int]]:
        """``ids`` cut into consecutive groups (module docstring: Layout)."""
        groups: List[List[int]] = [[]]
        elements = 0
        for probe_id in ids:
            known = _known_elements(self._tensors[probe_id])
            if groups[-1] and (len(groups[-1]) >= GROUP_SIZE or elements + known > GROUP_ELEMENTS):
                groups.append([])
                elements = 0
            groups[-1].append(probe_id)
            elements += known
        return [g for g in groups if g]

    def _build_flats(self, probe_ids: List[int]) -> None:
        """Adds the flattening of ``probe_ids``' tensors to the graph in one import."""
        if not probe_ids:
            return
        if self._flat_shape is None:
            with self.graph.as_default(), tf1.name_scope(SCOPE):
                self._flat_shape = tf1.constant([-1], name="flat_shape")
        copies = []
        for probe_id in probe_ids:
            template = _flattening(self._tensors[probe_id].dtype.as_datatype_enum)
            copies.append((template, {template.input: self._tensors[probe_id],
                                      template.shape: self._flat_shape}))
        for probe_id, outputs in zip(probe_ids, _import_copies(self.graph, copies, SCOPE + "flat")):
            self._flats[probe_id] = tuple(outputs)


class _Template:
    """A subgraph to copy: its GraphDef, the placeholders standing for its inputs, its outputs."""

    graph_def: graph_pb2.GraphDef
    outputs: Tuple[str, ...]


def _import_copies(graph: tf.Graph, copies, name: str) -> List[List[tf.Tensor]]:
    """Imports ``copies`` -- ``(template, {placeholder name: tensor of graph})`` -- into
    ``graph`` in one ``import_graph_def``; each copy's outputs, in order.  The placeholders
    are imported too, unread: a run never reaches them."""
    combined = graph_pb2.GraphDef()
    input_map, returns = {}, []
    for index, (template, inputs) in enumerate(copies):
        prefix = "c%d/" % index
        for node in template.graph_def.node:
            copy = combined.node.add()
            copy.CopyFrom(node)
            copy.name = prefix + node.name
            copy.input[:] = [("^" + prefix + i[1:]) if i.startswith("^") else prefix + i for i in node.input]
        input_map.update({prefix + placeholder: tensor for placeholder, tensor in inputs.items()})
        returns += [prefix + output for output in template.outputs]
    with graph.as_default():
        imported = tf1.import_graph_def(combined, input_map=input_map, return_elements=returns, name=name)
    result, start = [], 0
    for template, _ in copies:
        result.append(imported[start:start + len(template.outputs)])
        start += len(template.outputs)
    return result


class _Flattening(_Template):
    """One tensor flattened: float32 ``[-1]``, and its element count (int32)."""

    def __init__(self, dtype: int):
        graph = tf.Graph()
        with graph.as_default():
            tensor = tf1.placeholder(tf.as_dtype(dtype), name="probed")
            shape = tf1.placeholder(tf.int32, [1], name="flat_shape")  # one shared [-1], mapped in
            flat = tf1.reshape(tensor, shape)
            if flat.dtype != tf.float32:
                flat = tf1.cast(flat, tf.float32)
            size = tf1.size(flat, out_type=tf.int32)
        self.graph_def = graph.as_graph_def()
        self.input, self.shape = tensor.name, shape.name
        self.outputs = (flat.name, size.name)


@functools.lru_cache(maxsize=None)
def _flattening(dtype: int) -> _Flattening:
    return _Flattening(dtype)


class _GroupStats(_Template):
    """``n`` flattened tensors' ``(counts int32[n, 258], extrema float32[n, 2])``, reduced
    together (module docstring: Layout)."""

    def __init__(self, n: int, largest: float):
        graph = tf.Graph()
        with graph.as_default():
            flats = [tf1.placeholder(tf.float32, [None], name="flat_%d" % k) for k in range(n)]
            sizes = [tf1.placeholder(tf.int32, [], name="size_%d" % k) for k in range(n)]
            counts, extrema = _group_stats(flats, sizes, largest)
        self.graph_def = graph.as_graph_def()
        self.flats, self.sizes = [t.name for t in flats], [t.name for t in sizes]
        self.outputs = (counts.name, extrema.name)


@functools.lru_cache(maxsize=None)
def _group_template(n: int, largest: float) -> _GroupStats:
    return _GroupStats(n, largest)


def _known_elements(tensor: tf.Tensor) -> int:
    """The elements ``tensor`` holds as far as its static shape tells (unknown sizes count 1)."""
    dims = tensor.shape.dims
    if dims is None:
        return 1
    return int(np.prod([d.value if d.value is not None else 1 for d in dims], dtype=np.int64))


def _group_stats(flats: List[tf.Tensor], sizes: List[tf.Tensor],
                 largest: float) -> Tuple[tf.Tensor, tf.Tensor]:
    """The reductions of ``_GroupStats``."""
    values = tf1.abs(tf1.concat(flats, 0) if len(flats) > 1 else flats[0])
    exponents = tf1.bitwise.right_shift(tf1.bitcast(values, tf.int32), 23)  # no sign bit: 0..255
    zero = tf1.equal(values, 0.0)
    bins = tf1.where_v2(zero, ZERO_BIN, exponents)
    beyond = tf1.cast(tf1.greater(values, largest), tf.int32)
    nonzero = tf1.where_v2(zero, np.float32(np.inf), values)

    size_splits = tf1.stack(sizes)

    def per_tensor(elementwise):  # one SplitV node gives every tensor's part back
        if len(flats) == 1:
            return [elementwise]
        return tf1.split(elementwise, size_splits, num=len(flats))

    # The ops themselves, with their constants made once: tf.math.bincount adds eight ops to
    # size an output whose size is known, and each tf.reduce_* its own axis.
    axis, bin_count, no_weights = tf1.constant([0]), tf1.constant(ZERO_BIN + 1), tf1.constant([], tf.int32)
    histograms = [tf.raw_ops.Bincount(arr=b, size=bin_count, weights=no_weights) for b in per_tensor(bins)]
    overflows = [tf.raw_ops.Sum(input=b, axis=axis, keep_dims=True) for b in per_tensor(beyond)]
    counts = tf1.concat([tf1.stack(histograms), tf1.stack(overflows)], 1)
    biggest = [tf.raw_ops.Max(input=v, axis=axis, keep_dims=True) for v in per_tensor(values)]
    smallest = [tf.raw_ops.Min(input=v, axis=axis, keep_dims=True) for v in per_tensor(nonzero)]
    return counts, tf1.concat([tf1.stack(biggest), tf1.stack(smallest)], 1)

"""Tensor Core diagnostics: the share of MatMul/Conv FLOPs that runs in half, and the ops
whose dimensions miss the multiple-of-8 rule.

``diagnose(graph_def, report) -> TensorCoreReport`` (the command line stores it as
``report.tensor_cores``; ``RewriteReport.summary()`` prints it).

Static shapes: ``graph_def`` (its large float constants replaced by empty ones of the same
shape) is imported into a ``tf.Graph`` and each tensor's inferred shape is read; where
inference knows less, or the import fails, the nodes' ``_output_shapes`` attributes are
used.  Unknown dimensions count as 1, so with an unknown batch FLOPs are per example.

Per op::

    MatMul, BatchMatMul*    A[.., M, K] x B[.., K, N]    FLOPs = 2 * batch * M * N * K
                            Tensor Cores want M, N and K multiples of 8
    Conv2D, Conv3D and      y = conv(x, w[..spatial.., C_in, C_out])
      Conv2D's backprops    FLOPs = 2 * |y| * |spatial| * C_in   (a backprop: the forward's)
                            Tensor Cores want C_in and C_out multiples of 8
    DepthwiseConv2dNative   FLOPs = 2 * |y| * |spatial|; no Tensor Core kernel, not checked

A dimension that misses the rule is fixed by padding it to the next multiple of 8 (zero
weights, or rounding a layer's width up).  An unknown M (a MatMul's batch rows) cannot be
judged statically and is not flagged.  Only the top-level graph is analysed, not the
bodies of library functions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from tensorflow.core.framework import graph_pb2

from .graph_view import parse_input

Shape = Optional[List[Optional[int]]]  # None: unknown rank
_MATMULS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
_CONVS = frozenset({"Conv2D", "Conv3D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
                    "DepthwiseConv2dNative"})
TENSOR_CORE_OPS = _MATMULS | _CONVS
_STRIP_BYTES = 1024


@dataclass
class Dimension:
    """One dimension the multiple-of-8 rule applies to."""

    name: str                       # M, N, K, C_in or C_out
    size: Optional[int]             # None when not known statically
    padded: Optional[int] = None    # the next multiple of 8 when ``size`` is not one


@dataclass
class TensorCoreOp:
    """One MatMul/Conv op: its dtype after the rewrite, FLOPs and Tensor Core dimensions."""

    name: str
    op: str
    dtype: str
    half: bool
    flops: Optional[int]            # None when its shapes are not static
    dims: List[Dimension] = field(default_factory=list)
    aligned: Optional[bool] = None  # False: a known dimension misses the rule; None: not checked
    fix: str = ""                   # e.g. "pad C_in 3 -> 8"
    reason: str = ""                # why it stayed float32 (the report's reason)


@dataclass
class TensorCoreReport:
    """FLOP share in half and the ops that cannot use Tensor Cores (see module docstring)."""

    dtype: str
    shape_source: str
    total_flops: int = 0
    half_flops: int = 0
    half_flop_share: Optional[float] = None
    per_example: bool = False       # an unknown (batch) dimension was counted as 1
    ops: List[TensorCoreOp] = field(default_factory=list)

    def misaligned(self) -> List[TensorCoreOp]:
        """Half ops with a dimension that is not a multiple of 8."""
        return [op for op in self.ops if op.half and op.aligned is False]

    def summary_lines(self, max_rows: int = 10) -> List[str]:
        if not self.ops:
            return ["Tensor Cores: no MatMul/Conv op outside function bodies (those are not analysed)"]
        half_ops = sum(1 for op in self.ops if op.half)
        share = "n/a" if self.half_flop_share is None else "%.1f%%" % (100 * self.half_flop_share)
        lines = ["Tensor Cores: %s of MatMul/Conv FLOPs run in %s (%s of %s%s; %d of %d ops)" % (
            share, self.dtype, _gflop(self.half_flops), _gflop(self.total_flops),
            " per example" if self.per_example else "", half_ops, len(self.ops))]
        bad = self.misaligned()
        if bad:
            lines.append("  %d %s MatMul/Conv op(s) miss the multiple-of-8 rule (Tensor Core ineligible):"
                         % (len(bad), self.dtype))
            lines.extend("    %-40s %-14s %-26s %s" % (op.name, op.op, op.fix, self._flop_text(op))
                         for op in bad[:max_rows])
            if len(bad) > max_rows:
                lines.append("    ... %d more in the JSON report" % (len(bad) - max_rows))
        kept = [op for op in self.ops if not op.half]
        if kept:
            lines.append("  %d MatMul/Conv op(s) stay float32:" % len(kept))
            lines.extend("    %-40s %-14s %s" % (op.name, op.op, op.reason) for op in kept[:max_rows])
        unknown = [op.name for op in self.ops if op.flops is None]
        if unknown:
            lines.append("  FLOPs unknown (shapes not static) for: %s" % ", ".join(unknown[:max_rows]))
        lines.append("  shapes: %s" % self.shape_source)
        return lines

    def _flop_text(self, op: TensorCoreOp) -> str:
        if op.flops is None:
            return "FLOPs unknown"
        share = op.flops / self.total_flops if self.total_flops else 0.0
        return "%s (%.1f%%)" % (_gflop(op.flops), 100 * share)


def _gflop(flops: int) -> str:
    for scale, unit in ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP")):
        if flops >= scale:
            return "%.3g %s" % (flops / scale, unit)
    return "%d FLOP" % flops


def diagnose(graph_def, report) -> TensorCoreReport:
    """The TensorCoreReport of ``graph_def`` (the graph before the rewrite) and its ``report``."""
    decisions = {d.name: d for d in report.decisions}
    candidates = [node for node in graph_def.node if node.op in TENSOR_CORE_OPS and node.name in decisions]
    shapes, source = static_shapes(graph_def, [node.name for node in candidates])
    result = TensorCoreReport(dtype=report.dtype, shape_source=source)
    for node in candidates:
        decision = decisions[node.name]
        op = TensorCoreOp(name=node.name, op=node.op, dtype=decision.dtype, half=decision.converted,
                          flops=None, reason="" if decision.converted else decision.reason)
        unknown = _measure(op, node, shapes)
        result.per_example = result.per_example or unknown
        result.ops.append(op)
        if op.flops is not None:
            result.total_flops += op.flops
            if op.half:
                result.half_flops += op.flops
    if result.total_flops:
        result.half_flop_share = result.half_flops / result.total_flops
    return result


def _measure(op: TensorCoreOp, node, shapes: Dict[str, Shape]) -> bool:
    """Fills ``op``'s FLOPs and dimensions; True if an unknown dimension was counted as 1."""
    inputs = [text for text in node.input if not text.startswith("^")]

    def shape(tensor: str) -> Shape:
        name, port = parse_input(tensor)
        return shapes.get("%s:%d" % (name, port))

    output = node.name + ":0"
    if node.op in _MATMULS:
        return _measure_matmul(op, node, shape(inputs[0]), shape(inputs[1]), shape(output))
    filter_shape = shape(output) if node.op == "Conv2DBackpropFilter" else shape(inputs[1])
    forward_output = shape(inputs[2]) if node.op.startswith("Conv2DBackprop") else shape(output)
    return _measure_conv(op, filter_shape, forward_output)


def _measure_matmul(op: TensorCoreOp, node, a: Shape, b: Shape, y: Shape) -> bool:
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return False
    if node.op == "MatMul":
        flip_a, flip_b = _flag(node, "transpose_a"), _flag(node, "transpose_b")
    else:
        flip_a, flip_b = _flag(node, "adj_x"), _flag(node, "adj_y")
    m, k = (a[-1], a[-2]) if flip_a else (a[-2], a[-1])
    n = b[-2] if flip_b else b[-1]
    batch = list(y[:-2]) if y is not None and len(y) >= 2 else []
    op.dims = [_dimension("M", m), _dimension("N", n), _dimension("K", k)]
    _judge(op)
    return _count_flops(op, [2, m, n, k] + batch)


def _flag(node, name: str) -> bool:
    return node.attr[name].b if name in node.attr else False


def _measure_conv(op: TensorCoreOp, w: Shape, y: Shape) -> bool:
    if w is None or y is None or len(w) < 3:
        return False
    spatial, c_in, c_out = w[:-2], w[-2], w[-1]
    if op.op == "DepthwiseConv2dNative":
        return _count_flops(op, [2] + list(spatial) + list(y))
    op.dims = [_dimension("C_in", c_in), _dimension("C_out", c_out)]
    _judge(op)
    return _count_flops(op, [2, c_in] + list(spatial) + list(y))


def _dimension(name: str, size: Optional[int]) -> Dimension:
    padded = None if size is None or size % 8 == 0 else (size + 7) // 8 * 8
    return Dimension(name, size, padded)


def _judge(op: TensorCoreOp) -> None:
    bad = [d for d in op.dims if d.padded is not None]
    op.aligned = not bad
    op.fix = ", ".join("pad %s %d -> %d" % (d.name, d.size, d.padded) for d in bad)


def _count_flops(op: TensorCoreOp, factors: Sequence[Optional[int]]) -> bool:
    flops = 1
    for factor in factors:
        flops *= 1 if factor is None else factor
    op.flops = flops
    return any(factor is None for factor in factors)


# -- static shapes ----------------------------------------------------------------------
def static_shapes(graph_def, node_names: Sequence[str]):
    """``({"node:port": Shape}, source)`` for the inputs and outputs of ``node_names``."""
    wanted = set(node_names)
    shapes = _output_shapes_attrs(graph_def, wanted)
    source = "_output_shapes attributes"
    try:
        inferred = _inferred_shapes(graph_def, wanted)
    except Exception as error:  # an unknown op, a malformed graph: fall back to the attributes
        return shapes, "%s (TensorFlow's shape inference failed: %s)" % (
            source if shapes else "unavailable", str(error).splitlines()[0][:120])
    attributes_used = False
    for tensor, shape in inferred.items():
        known = shapes.get(tensor)
        if known is not None and _unknown_count(known) < _unknown_count(shape):
            attributes_used = True  # the attribute knows more than inference
            continue
        shapes[tensor] = shape
    return shapes, "TensorFlow shape inference" + (" and %s" % source if attributes_used else "")


def _unknown_count(shape: Shape) -> int:
    return 1000 if shape is None else sum(1 for d in shape if d is None)


def _output_shapes_attrs(graph_def, wanted) -> Dict[str, Shape]:
    tensors = _tensors_of(graph_def, wanted)
    shapes: Dict[str, Shape] = {}
    for node in graph_def.node:
        if "_output_shapes" not in node.attr:
            continue
        for port, proto in enumerate(node.attr["_output_shapes"].list.shape):
            tensor = "%s:%d" % (node.name, port)
            if tensor in tensors and not proto.unknown_rank:
                shapes[tensor] = [d.size if d.size >= 0 else None for d in proto.dim]
    return shapes


def _tensors_of(graph_def, wanted) -> set:
    tensors = set()
    for node in graph_def.node:
        if node.name in wanted:
            tensors.add(node.name + ":0")
            for text in node.input:
                name, port = parse_input(text)
                if port >= 0:
                    tensors.add("%s:%d" % (name, port))
    return tensors


def _inferred_shapes(graph_def, wanted) -> Dict[str, Shape]:
    import tensorflow as tf

    graph = tf.compat.v1.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(_without_large_constants(graph_def), name="")
    shapes: Dict[str, Shape] = {}
    for tensor in _tensors_of(graph_def, wanted):
        name, port = parse_input(tensor)
        static = graph.get_operation_by_name(name).outputs[port].shape
        shapes[tensor] = static.as_list() if static.rank is not None else None
    return shapes


def _without_large_constants(graph_def):
    """A copy of ``graph_def`` whose large float Consts hold no values (shape inference only)."""
    light = graph_pb2.GraphDef()
    light.versions.CopyFrom(graph_def.versions)
    light.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        copy = light.node.add()
        if node.op == "Const" and len(node.attr["value"].tensor.tensor_content) > _STRIP_BYTES:
            copy.name, copy.op, copy.device = node.name, node.op, node.device
            copy.input.extend(node.input)
            for key, value in node.attr.items():
                if key != "value":
                    copy.attr[key].CopyFrom(value)
            copy.attr["value"].tensor.dtype = node.attr["value"].tensor.dtype
            copy.attr["value"].tensor.tensor_shape.CopyFrom(node.attr["value"].tensor.tensor_shape)
        else:
            copy.CopyFrom(node)
    return light

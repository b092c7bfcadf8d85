"""Half constants: Cast(Const) folded into a half Const, and the range check that decides how.

After the rewrite, every float32 Const feeding a half op does so through a Cast the
rewrite added.  ``fold_constants`` stores such constants in half instead (so weights take
half the bytes), rounding to nearest even as the Cast would at run time::

    for each half Cast of the rewrite whose input is a float32 Const c:
        v = half(c)          # float16 or bfloat16, round to nearest even
        if c feeds nothing but half Casts and is no graph input/output:
            c becomes a half Const in place (same name); its Casts are removed
        else:
            the Cast becomes a half Const of the same name (c stays for its float32 users)

A constant *does not fit* when the conversion loses it (``range_issue``):

* overflow: a finite value becomes inf (|x| > 65504 for float16);
* underflow: a non-zero value becomes 0 although it is at least 2**-11 of the constant's
  largest magnitude (smaller ones are below half precision's resolution next to that
  value anyway; they are only counted, as ``flushed_to_zero``).

Such constants are handled by one of two rules (``--out-of-range``), reported per constant:

* ``keep-float32`` (default): the ops reading the constant are excluded from the rewrite and
  the pass runs again (``exclusions_for_out_of_range``), so that path stays float32;
* ``clamp``: as onnxconverter-common's ``max_finite_val`` / ``min_positive_val``, values are
  clamped to +-the largest finite half value, lost small ones to +-the smallest positive
  one (2**-24 for float16, 2**-126 for bfloat16), with a warning per constant.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
from tensorflow.core.framework import tensor_pb2

from ..dtypes import DT_FLOAT, TARGET_DTYPES
from ..graph_rewrite.graph_view import parse_input
from .graph_io import bypass_nodes

POLICIES = ("keep-float32", "clamp")
_PASS_THROUGH = frozenset({"Identity", "Snapshot"})
_LIMITS = {"float16": (65504.0, 2.0 ** -24), "bfloat16": (3.3895313892515355e38, 2.0 ** -126)}
_RESOLUTION = 2.0 ** -11


@dataclass
class ConstantRange:
    """One constant whose values do not fit the half dtype, and what was done about it."""

    name: str
    consumers: List[str]
    elements: int
    overflow: int             # finite values that would become inf
    underflow: int            # significant non-zero values that would become 0
    max_abs: float
    min_abs_nonzero: float
    action: str               # "kept float32" or "clamped"


@dataclass
class FoldedConstant:
    """One constant now stored in half."""

    name: str                 # the float32 Const
    node: str                 # the half Const: ``name`` itself, or the Cast it replaced
    elements: int
    consumers: List[str]      # the half ops reading it


@dataclass
class ConstantReport:
    """What ``fold_constants`` did: folded constants, bytes saved, range problems."""

    dtype: str
    policy: str
    folded: int = 0                    # constants now stored in half
    casts_removed: int = 0             # Casts gone (the Const itself became half)
    bytes_before: int = 0              # of the folded constants' values, float32
    bytes_after: int = 0               # and in half
    flushed_to_zero: int = 0           # negligible non-zero values that became 0
    out_of_range: List[ConstantRange] = field(default_factory=list)
    constants: List[FoldedConstant] = field(default_factory=list)

    def summary_lines(self) -> List[str]:
        lines = ["Constants: %d folded into %s (%.1f MB -> %.1f MB), %d Cast(s) removed" % (
            self.folded, self.dtype, self.bytes_before / 1e6, self.bytes_after / 1e6, self.casts_removed)]
        if self.flushed_to_zero:
            lines.append("  %d negligible value(s) below the smallest %s flushed to zero" % (
                self.flushed_to_zero, self.dtype))
        for item in self.out_of_range:
            lines.append("  warning: constant %r does not fit %s (%s; |x| in [%.3g, %.3g]): %s" % (
                item.name, self.dtype, _describe_loss(item), item.min_abs_nonzero, item.max_abs, item.action))
        return lines


def _describe_loss(item: ConstantRange) -> str:
    parts = []
    if item.overflow:
        parts.append("%d of %d value(s) overflow" % (item.overflow, item.elements))
    if item.underflow:
        parts.append("%d of %d value(s) underflow to 0" % (item.underflow, item.elements))
    return ", ".join(parts)


def to_half_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """The uint16 bit patterns of ``values`` (float32) in ``dtype``, rounded to nearest even."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).view(np.uint16)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def from_half_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of half bit patterns (the inverse of ``to_half_bits`` on representable values)."""
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def range_issue(name: str, values: np.ndarray, dtype: str) -> Tuple[Optional[ConstantRange], int]:
    """``(ConstantRange or None, negligible values flushed to zero)`` for one constant."""
    values = np.asarray(values, dtype=np.float32).ravel()
    half = from_half_bits(to_half_bits(values, dtype), dtype)
    magnitude = np.abs(values)
    finite = np.isfinite(values)
    overflow = int(np.count_nonzero(finite & ~np.isfinite(half)))
    flushed = (values != 0) & (half == 0)
    largest = float(magnitude[finite].max()) if finite.any() else 0.0
    significant = flushed & (magnitude >= largest * _RESOLUTION)
    underflow = int(np.count_nonzero(significant))
    negligible = int(np.count_nonzero(flushed)) - underflow
    if not overflow and not underflow:
        return None, negligible
    nonzero = magnitude[(values != 0) & finite]
    return ConstantRange(name=name, consumers=[], elements=int(values.size), overflow=overflow,
                         underflow=underflow, max_abs=largest,
                         min_abs_nonzero=float(nonzero.min()) if nonzero.size else 0.0,
                         action=""), negligible


def clamp_to_range(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` with overflowing and significant underflowing elements clamped into range."""
    largest, smallest = _LIMITS[dtype]
    values = np.clip(np.asarray(values, dtype=np.float32), -largest, largest)
    magnitude = np.abs(values)
    peak = float(magnitude[np.isfinite(magnitude)].max()) if magnitude.size else 0.0
    lost = (values != 0) & (magnitude < smallest) & (magnitude >= peak * _RESOLUTION)
    return np.where(lost, np.copysign(np.float32(smallest), values), values).astype(np.float32)


def half_const_sources(graph_def, casts) -> Dict[str, Tuple[object, object]]:
    """``{cast name: (Cast NodeDef, float32 Const NodeDef)}`` for the rewrite's half Casts of Consts."""
    nodes = {node.name: node for node in graph_def.node}
    result = {}
    for cast in casts:
        node, source = nodes.get(cast.name), nodes.get(cast.source)
        if (cast.to_dtype != "float32" and cast.port == 0 and node is not None and source is not None
                and source.op == "Const" and source.attr["dtype"].type == DT_FLOAT):
            result[cast.name] = (node, source)
    return result


def exclusions_for_out_of_range(graph_def, casts, dtype: str) -> Tuple[Dict[str, str], List[ConstantRange]]:
    """For ``keep-float32``: ``{node to exclude: out-of-range Const it reads}`` and the issues.

    The nodes are the consumers of every half Cast whose value comes from such a Const,
    directly or through Identity nodes.
    """
    nodes = {node.name: node for node in graph_def.node}
    consumers = _data_consumer_names(graph_def)
    excluded: Dict[str, str] = {}
    issues: Dict[str, ConstantRange] = {}
    checked: Dict[str, Optional[ConstantRange]] = {}
    for cast in casts:
        if cast.to_dtype == "float32" or cast.name not in nodes:
            continue
        const = _value_source(nodes, cast.source)
        if const is None:
            continue
        if const.name not in checked:
            checked[const.name] = range_issue(const.name, _const_value(const), dtype)[0]
        issue = checked[const.name]
        if issue is None:
            continue
        issues.setdefault(const.name, issue)
        for consumer in consumers.get(cast.name, ()):
            excluded.setdefault(consumer, const.name)
    return excluded, list(issues.values())


def _value_source(nodes, name: str):
    """The float32 Const ``name`` reads, through Identity / Snapshot nodes, or None."""
    for _ in range(100):
        node = nodes.get(name)
        if node is None:
            return None
        if node.op == "Const":
            return node if node.attr["dtype"].type == DT_FLOAT else None
        if node.op not in _PASS_THROUGH or not node.input:
            return None
        name, port = parse_input(node.input[0])
        if port != 0:
            return None
    return None


def _const_value(node) -> np.ndarray:
    import tensorflow as tf

    return tf.compat.v1.make_ndarray(node.attr["value"].tensor)


def fold_constants(graph_def, casts, dtype: str, policy: str = "keep-float32",
                   preserved: Set[str] = frozenset()) -> ConstantReport:
    """Folds the rewrite's half Casts of Consts in ``graph_def`` (in place; see module docstring).

    ``casts`` are the report's CastInfo records; ``preserved`` names nodes that must keep
    their dtype (graph inputs and outputs).  Out-of-range constants are clamped under the
    ``clamp`` policy and left unfolded (their Casts stay) otherwise.
    """
    if policy not in POLICIES:
        raise ValueError("policy=%r: use one of %s" % (policy, ", ".join(POLICIES)))
    report = ConstantReport(dtype=dtype, policy=policy)
    sources = half_const_sources(graph_def, casts)
    half_casts_of: Dict[str, List[str]] = {}
    for cast_name, (_, const) in sources.items():
        half_casts_of.setdefault(const.name, []).append(cast_name)
    data_consumers = _data_consumer_names(graph_def)
    bypass: Dict[str, str] = {}
    for const_name, cast_names in half_casts_of.items():
        const = sources[cast_names[0]][1]
        values = _const_value(const)
        issue, negligible = range_issue(const_name, values, dtype)
        consumers = sorted({c for name in cast_names for c in data_consumers.get(name, ())})
        if issue is not None:
            issue.consumers = consumers
            report.out_of_range.append(issue)
            if policy != "clamp":  # only if the readers could not be excluded: the Cast stays
                issue.action = "not folded: its Cast stays"
                continue
            issue.action = "clamped into the %s range" % dtype
            values = clamp_to_range(values, dtype)
        report.flushed_to_zero += negligible
        tensor = half_tensor(const.attr["value"].tensor, values, dtype)
        report.folded += 1
        report.bytes_before += values.size * 4
        report.bytes_after += values.size * 2
        in_place = (const_name not in preserved
                    and set(data_consumers.get(const_name, ())) <= set(cast_names))
        if in_place:
            const.attr["dtype"].type = TARGET_DTYPES[dtype]
            const.attr["value"].tensor.CopyFrom(tensor)
            bypass.update(dict.fromkeys(cast_names, const_name))
            report.constants.append(FoldedConstant(const_name, const_name, int(values.size), consumers))
            continue
        for cast_name in cast_names:
            _cast_to_const(sources[cast_name][0], const, tensor, dtype)
            report.constants.append(FoldedConstant(const_name, cast_name, int(values.size), consumers))
    if bypass:
        bypass_nodes(graph_def, bypass)
        report.casts_removed = len(bypass)
    return report


def _data_consumer_names(graph_def) -> Dict[str, List[str]]:
    result: Dict[str, List[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            name, port = parse_input(text)
            if port >= 0:
                result.setdefault(name, []).append(node.name)
    return result


def _cast_to_const(cast, const, tensor, dtype: str) -> None:
    """Turns the Cast NodeDef into a half Const with the same name, device and control inputs."""
    name, device = cast.name, cast.device
    cast.Clear()
    cast.name, cast.op, cast.device = name, "Const", device
    cast.input.extend(text for text in const.input if text.startswith("^"))
    cast.attr["dtype"].type = TARGET_DTYPES[dtype]
    cast.attr["value"].tensor.CopyFrom(tensor)


def half_tensor(original, values: np.ndarray, dtype: str):
    """A TensorProto of ``values`` in ``dtype`` with ``original``'s shape.

    A constant stored as one broadcast value stays one value; others use tensor_content.
    """
    bits = to_half_bits(np.asarray(values, dtype=np.float32).ravel(), dtype)
    tensor = tensor_pb2.TensorProto(dtype=TARGET_DTYPES[dtype])
    tensor.tensor_shape.CopyFrom(original.tensor_shape)
    if not original.tensor_content and len(original.float_val) <= 1 and bits.size and (bits == bits[0]).all():
        tensor.half_val.append(int(bits[0]))
    else:
        tensor.tensor_content = bits.astype("<u2").tobytes()
    return tensor

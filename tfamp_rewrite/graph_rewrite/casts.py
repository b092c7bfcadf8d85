"""Applies a Paint: type attributes become half, Cast nodes go on colour boundaries.

``apply_paint(view, paint, target_dtype, naming) -> AppliedPaint`` mutates the graph the
view indexes (the rewrite's private copy):

* every allow vertex that is a float32 type attribute is set to the target dtype;
* every data edge whose ends now differ (half producer -> float32 consumer, or the
  reverse) is routed through a Cast.  Casts are shared: one per producer output port
  (a port needs only one direction), named as Grappler names them, on the producer's
  device.  Control edges are untouched.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Set, Tuple

from ..dtypes import DT_BFLOAT16, DT_FLOAT, DT_HALF, dtype_name
from .graph_view import UNKNOWN_ATTR, GraphView
from .painter import Paint


@dataclass
class CastInfo:
    """One Cast the rewrite added: its name, the tensor it casts, to what, and who reads it."""

    name: str
    source: str
    port: int
    to_dtype: str
    consumers: List[str] = field(default_factory=list)


CAST_SUFFIX = "AutoMixedPrecision"
_VARIABLE_OPS = frozenset({"Variable", "VariableV2", "VarHandleOp", "ReadVariableOp"})


@dataclass
class AppliedPaint:
    """What changed: converted vertices and nodes, and the Casts added."""

    converted_vertices: Set[int] = field(default_factory=set)
    converted_nodes: Set[int] = field(default_factory=set)
    casts: List[CastInfo] = field(default_factory=list)


def cast_name(source: str, port: int, to_dtype: int, index: int = None, prefix: str = "",
              verb: str = "Cast") -> str:
    """Grappler's name: ``<src>-<port>-CastToFp16-<k>-AutoMixedPrecision`` (TF 1.15: no k);
    ``prefix`` goes before ``CastTo`` (emulation's Casts are ``EmulateCastTo...``), ``verb``
    replaces ``Cast`` (emulation's rounding ops are ``EmulateRoundTo...``)."""
    kind = prefix + verb + ("ToFp32" if to_dtype == DT_FLOAT else (
        "ToBf16" if to_dtype == DT_BFLOAT16 else "ToFp16"))
    parts = [source, str(port), kind] + ([] if index is None else [str(index)]) + [CAST_SUFFIX]
    return "-".join(parts)


def unique_cast_name(source: str, port: int, to_dtype: int, taken: Set[str], prefix: str = "",
                     verb: str = "Cast") -> str:
    """``cast_name`` with the smallest index ``k`` not in ``taken`` (which it joins)."""
    index = 0
    while cast_name(source, port, to_dtype, index, prefix, verb) in taken:
        index += 1
    name = cast_name(source, port, to_dtype, index, prefix, verb)
    taken.add(name)
    return name


def add_cast_node(graph_def, name: str, input_name: str, device: str, src_dtype: int, to_dtype: int):
    """Appends ``Cast(input_name)`` from ``src_dtype`` to ``to_dtype`` (round to nearest even)."""
    cast = graph_def.node.add()
    cast.name = name
    cast.op = "Cast"
    cast.device = device
    cast.input.append(input_name)
    cast.attr["SrcT"].type = src_dtype
    cast.attr["DstT"].type = to_dtype
    cast.attr["Truncate"].b = False
    return cast


def apply_paint(view: GraphView, paint: Paint, target_dtype: int,
                indexed_names: bool = True) -> AppliedPaint:
    """Mutates ``view.graph_def`` as described in the module docstring."""
    result = AppliedPaint()
    converts = _converted_vertices(view, paint)
    result.converted_vertices = converts
    for vertex in sorted(converts):
        node = view.vertex_node[vertex]
        set_type_attr(view.nodes[node], view.vertex_attr[vertex], target_dtype)
        result.converted_nodes.add(node)
    taken = set(view.index)
    casts: Dict[Tuple[int, int], CastInfo] = {}
    vertices, out_attrs = view.vertices, view.out_attrs
    for dst, data in enumerate(view.inputs):
        in_attrs = view.in_attrs[dst]
        for port, (src, src_port) in enumerate(data):
            outs = out_attrs[src]
            src_vertex = vertices[src][outs[src_port] if outs is not None else UNKNOWN_ATTR]
            src_half = src_vertex in converts
            if src_half == (vertices[dst][in_attrs[port]] in converts):
                continue
            record = casts.get((src, src_port))
            if record is None:
                record = _add_cast(view, src, src_port,
                                   DT_FLOAT if src_half else target_dtype, taken, indexed_names)
                casts[(src, src_port)] = record
                result.casts.append(record)
            consumer = view.nodes[dst]
            consumer.input[view.input_slots[dst][port]] = record.name
            record.consumers.append(consumer.name)
    return result


def _converted_vertices(view: GraphView, paint: Paint) -> Set[int]:
    """Allow vertices that really change: float32 type attributes (fixed types never do)."""
    dtype, attr = view.vertex_dtype, view.vertex_attr
    return {v for v in paint.allow if dtype[v] == DT_FLOAT and attr[v][0]}


def set_type_attr(node, type_attr, dtype: int) -> None:
    """Sets the ``type`` attribute (or the ``list(type)`` element) ``type_attr`` of ``node``."""
    name, index = type_attr
    if index < 0:
        node.attr[name].type = dtype
    else:
        node.attr[name].list.type[index] = dtype


def _add_cast(view: GraphView, src: int, port: int, to_dtype: int, taken: Set[str],
              indexed_names: bool, src_dtype: int = None) -> CastInfo:
    """Adds ``Cast(src:port)`` to ``to_dtype`` to the graph; ``src_dtype`` defaults to the
    dtype the rewrite gives the producer (float32 when casting to half, else its half)."""
    source = view.nodes[src]
    if indexed_names:
        name = unique_cast_name(source.name, port, to_dtype, taken)
        input_name = source.name if port == 0 else "%s:%d" % (source.name, port)
    else:
        name = cast_name(source.name, port, to_dtype)
        input_name = "%s:%d" % (source.name, port)
        taken.add(name)
    if src_dtype is None:
        src_dtype = DT_FLOAT if to_dtype != DT_FLOAT else _half_of(view, src, port)
    add_cast_node(view.graph_def, name, input_name, source.device, src_dtype, to_dtype)
    return CastInfo(name=name, source=source.name, port=port, to_dtype=dtype_name(to_dtype))


def _half_of(view: GraphView, src: int, port: int) -> int:
    """The dtype a converted producer port now has (read back from its node)."""
    name, index = view.output_attr(src, port)
    value = view.nodes[src].attr[name]
    return value.type if index < 0 else value.list.type[index]


def is_variable_read(view: GraphView, node: int) -> bool:
    """Const, variables and Identity-of-variable: casts from them are not counted by TF."""
    op = view.ops[node]
    if op == "Const" or op in _VARIABLE_OPS:
        return True
    if op == "Identity":
        source = view.regular_input_node(node, 0)
        return source is not None and view.ops[source] in _VARIABLE_OPS
    return False


_FLOAT_KINDS = frozenset({DT_FLOAT, DT_HALF, DT_BFLOAT16})


def reconcile_dtypes(view: GraphView, consumers, indexed_names: bool = True,
                     taken_elsewhere: Set[str] = frozenset()) -> List[CastInfo]:
    """Routes data inputs of ``consumers`` whose producer dtype differs through a Cast.

    For graphs assembled from parts rewritten at different times (a session importing
    nodes added after its first run): wherever the producer's output is, say, half while
    the consumer now expects float32, a Cast (shared per producer port and dtype) fixes
    the edge.  Only float kinds are reconciled; anything else is left to TensorFlow's
    type check.  The Casts' names avoid ``view``'s and ``taken_elsewhere``.
    """
    taken = set(view.index) | set(taken_elsewhere)
    added: Dict[Tuple[int, int, int], CastInfo] = {}
    for dst in consumers:
        for port, (src, src_port) in enumerate(view.inputs[dst]):
            have = view.vertex_dtype[view.output_vertex(src, src_port)]
            want = view.vertex_dtype[view.input_vertex(dst, port)]
            if have == want or have not in _FLOAT_KINDS or want not in _FLOAT_KINDS:
                continue
            record = added.get((src, src_port, want))
            if record is None:
                record = _add_cast(view, src, src_port, want, taken, indexed_names, src_dtype=have)
                added[(src, src_port, want)] = record
            view.nodes[dst].input[view.input_slots[dst][port]] = record.name
            record.consumers.append(view.nodes[dst].name)
    return list(added.values())

"""Emulation's rounding Cast pairs as single ``RoundToHalf`` nodes, where that op is loaded.

``emulate_half`` rounds each emulated half output with two Casts, ``Cast(Cast(x, half),
float32)``: stock ops, so its graphs run on any TensorFlow and can be written out.  Two
TensorFlow Cast kernels are two passes over memory, and the CPU's float32 -> float16 Cast
is slow.  Where the compiled op library is loaded -- sessions and ``tfamp-rewrite convert
--validate``, which run the graph in this process and never write it out --
``use_rounding_op`` replaces each such pair with one ``RoundToHalf`` node, which computes
the same bits in one pass (custom_ops/round_to_half)::

    a rounding pair: N = Cast(P:p, half) -> W = Cast(N, float32), both Casts the rewrite
    added -- N emulation's or the pass's (a weight or input cast for half nodes), W
    emulation's (emulated readers) or the pass's (a float32 reader of an emulated half
    output, e.g. an optimizer reading a gradient)
    for each narrowing Cast N with such W's, not placed on a GPU (RoundToHalf has a CPU kernel only):
        R = RoundToHalf(P:p, half_type=half)  named <src>-<port>-EmulateRoundToFp16-<k>-AutoMixedPrecision
        emulation's W:  removed, its readers read R
        the pass's W:   if read, its data readers read R; W stays, unread (a fetch by name
                        still finds it)
        N:              removed if it is emulation's and only removed W's read it; else it
                        stays (for nodes that stay half, or as the kept W's input)
    R reads P:p, never N, so a pair becomes the same R whoever else reads N (a session
    imports a growing graph in steps).  The same in every function body (while v2, functions).

Casts left without readers are not run: TensorFlow runs only what a fetch needs.  Fetches
of rounded outputs follow the rename: ``RoundingOps.renamed`` maps each removed ``W:0`` to
``R:0``, and ``use_rounding_op`` applies it to ``EmulationReport.rounded_outputs``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from tensorflow.core.framework import node_def_pb2

from ..dtypes import DT_FLOAT, HALF_DTYPES
from .casts import CAST_SUFFIX, unique_cast_name
from .eligibility import device_type
from .emulation import EmulationReport, is_emulation_cast
from .functions import UnsupportedFunction, body_as_graph, graph_as_body
from .graph_view import parse_input
from .rewrite import op_def_lookup

ROUND_OP_TYPE = "RoundToHalf"
HALF_TYPE_ATTR = "half_type"


@dataclass
class RoundingOps:
    """What ``use_rounding_op`` changed in one graph (its function bodies included)."""

    replaced: int = 0        # RoundToHalf nodes added, one per rounded tensor (narrowing Cast)
    bypassed: int = 0        # the pass's Casts back to float32 whose readers now read one
    narrowing_kept: int = 0  # narrowing Casts kept (the pass's, or still read)
    kept_on_gpu: int = 0     # widening Casts left as they are because they are placed on a GPU
    # the graph's removed "W:0" -> the "R:0" that replaced it (function bodies not included)
    renamed: Dict[str, str] = field(default_factory=dict)


def use_rounding_op(graph_def, emulation: Optional[EmulationReport] = None) -> RoundingOps:
    """Replaces emulation's rounding Cast pairs in ``graph_def`` itself (module docstring).

    ``emulation``, the report of the emulation that made the pairs, gets the count
    (``rounding_ops``) and the new names of the rounded outputs.  The result runs only
    where the op library is loaded.
    """
    result = RoundingOps()
    _replace_pairs(graph_def, result, result.renamed)
    lookup = op_def_lookup(graph_def)
    for fdef in graph_def.library.function:
        if not any(is_emulation_cast(node) for node in fdef.node_def):
            continue
        try:
            body = body_as_graph(fdef, lookup)
        except UnsupportedFunction:
            continue  # emulation could not have rewritten it either
        if _replace_pairs(body.graph, result, None):
            fdef.CopyFrom(graph_as_body(body, fdef, lookup))
    if emulation is not None:
        emulation.rounding_ops += result.replaced
        emulation.rounded_outputs = {output: result.renamed.get(tensor, tensor)
                                     for output, tensor in emulation.rounded_outputs.items()}
    return result


def is_emulation_node(node) -> bool:
    """Whether ``node`` is one of emulation's Casts or a RoundToHalf node replacing a pair."""
    return is_emulation_cast(node) or (
        node.op == ROUND_OP_TYPE and "-EmulateRoundTo" in node.name and node.name.endswith(CAST_SUFFIX))


def _replace_pairs(graph_def, result: RoundingOps, renamed: Optional[Dict[str, str]]) -> int:
    """Rounds with RoundToHalf in one graph; returns how many nodes it added."""
    nodes = {node.name: node for node in graph_def.node}
    readers: Dict[str, int] = {}
    for node in graph_def.node:
        for text in node.input:
            name = parse_input(text)[0]
            readers[name] = readers.get(name, 0) + 1
    taken = set(nodes)
    rounding: Dict[str, node_def_pb2.NodeDef] = {}   # N's name -> its R
    replaced: Dict[str, node_def_pb2.NodeDef] = {}   # emulation's W -> R (W goes)
    bypassed: Dict[str, node_def_pb2.NodeDef] = {}   # the pass's W -> R (W stays, unread)
    for node in graph_def.node:
        narrow = _narrowing_cast_of_pair(node, nodes)
        if narrow is None or not (is_emulation_cast(node) or readers.get(node.name)):
            continue  # a Cast of the pass's nothing reads needs no bypass (it does not run)
        if "GPU" in device_type(node.device):
            result.kept_on_gpu += 1
            continue
        if narrow.name not in rounding:
            rounding[narrow.name] = _rounding_node(narrow, node, taken)
        (replaced if is_emulation_cast(node) else bypassed)[node.name] = rounding[narrow.name]
    if not rounding:
        return 0
    removed = set(replaced)
    removed_readers: Dict[str, int] = {}  # N's name -> how many of its readers go
    for name in replaced:
        narrow = parse_input(nodes[name].input[0])[0]
        removed_readers[narrow] = removed_readers.get(narrow, 0) + 1
    for name in rounding:
        if is_emulation_cast(nodes[name]) and readers[name] == removed_readers.get(name, 0):
            removed.add(name)
        else:
            result.narrowing_kept += 1
    kept, placed = [], set()
    for node in graph_def.node:
        new = replaced.get(node.name)
        if new is not None and new.name not in placed:  # R where the first W it replaces was
            kept.append(new)
            placed.add(new.name)
        elif node.name not in removed:
            kept.append(node)
            _rewire(node, replaced, bypassed)
    kept.extend(r for r in rounding.values() if r.name not in placed)
    del graph_def.node[:]
    graph_def.node.extend(kept)
    result.replaced += len(rounding)
    result.bypassed += len(bypassed)
    if renamed is not None:
        renamed.update({old + ":0": new.name + ":0" for old, new in replaced.items()})
    return len(rounding)


def _is_rewrite_cast(node, src: int, dst: int) -> bool:
    """A Cast the rewrite added (the pass's or emulation's), ``src`` -> ``dst``, rounding to nearest."""
    return (node.op == "Cast" and node.name.endswith(CAST_SUFFIX) and "CastTo" in node.name
            and not node.attr["Truncate"].b and node.attr["SrcT"].type == src
            and node.attr["DstT"].type == dst)


def _narrowing_cast_of_pair(node, nodes) -> Optional[object]:
    """N when ``node`` is the W of a rounding pair ``N = Cast(x, half) -> W = Cast(N, float32)``
    of the rewrite's Casts (module docstring)."""
    half = node.attr["SrcT"].type if node.op == "Cast" else None
    if half not in HALF_DTYPES or not _is_rewrite_cast(node, half, DT_FLOAT):
        return None
    name, port = parse_input(node.input[0])
    narrow = nodes.get(name)
    if port != 0 or narrow is None or not _is_rewrite_cast(narrow, DT_FLOAT, half):
        return None
    return narrow


def _rounding_node(narrow, widen, taken) -> node_def_pb2.NodeDef:
    """``RoundToHalf(narrow's input)`` where ``widen`` was, named after the rounded tensor."""
    half = widen.attr["SrcT"].type
    source, port = parse_input(narrow.input[0])
    node = node_def_pb2.NodeDef()
    node.name = unique_cast_name(source, port, half, taken, prefix="Emulate", verb="Round")
    node.op = ROUND_OP_TYPE
    node.device = widen.device
    node.input.append(narrow.input[0])
    node.attr[HALF_TYPE_ATTR].type = half
    return node


def _rewire(node, replaced: Dict[str, node_def_pb2.NodeDef],
            bypassed: Dict[str, node_def_pb2.NodeDef]) -> None:
    """Points ``node``'s inputs from each removed W to its R (control inputs too), and its data
    inputs from each bypassed W to its R (a W has one output)."""
    for slot, text in enumerate(node.input):
        name, port = parse_input(text)
        if name in replaced:
            new = replaced[name].name
            node.input[slot] = "^" + new if port < 0 else new
        elif name in bypassed and port >= 0:
            node.input[slot] = bypassed[name].name

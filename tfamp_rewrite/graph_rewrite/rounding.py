"""Emulation's rounding Cast pairs as single ``RoundToHalf`` nodes, where that op is loaded.

``emulate_half`` rounds each emulated half output with two Casts, ``Cast(Cast(x, half),
float32)``: stock ops, so its graphs run on any TensorFlow and can be written out.  Two
TensorFlow Cast kernels are two passes over memory, and the CPU's float32 -> float16 Cast
is slow.  Where the compiled op library is loaded -- sessions and ``tfamp-rewrite convert
--validate``, which run the graph in this process and never write it out --
``use_rounding_op`` replaces each pair with one ``RoundToHalf`` node, which computes the
same bits in one pass (custom_ops/round_to_half)::

    for each rounding pair  N = Cast(P:p, half) -> W = Cast(N, float32), where W is one of
    emulation's Casts and N one of emulation's or the pass's own (a float32 tensor -- a
    weight, an input -- cast for half nodes, widened again for emulated ones):
        W placed on a GPU:  keep both (RoundToHalf has a CPU kernel only)
        R = RoundToHalf(P:p, half_type=half)  named <src>-<port>-EmulateRoundToFp16-<k>-AutoMixedPrecision
        W's readers read R; W goes
        N goes if it is emulation's and W was its only reader; else it stays for its other
          readers (nodes that stay half) -- R still reads P:p, so a pair becomes the same R
          whoever else reads N (a session imports a growing graph in steps)
    the same in every function body (while loops v2, functions)

Fetches of rounded outputs follow the rename: ``RoundingOps.renamed`` maps each removed
``W:0`` to ``R:0``, and ``use_rounding_op`` applies it to ``EmulationReport.rounded_outputs``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from tensorflow.core.framework import node_def_pb2

from ..dtypes import DT_BFLOAT16, DT_FLOAT, DT_HALF
from .casts import CAST_SUFFIX, unique_cast_name
from .eligibility import device_type
from .emulation import EmulationReport, is_emulation_cast
from .functions import UnsupportedFunction, body_as_graph, graph_as_body
from .graph_view import parse_input
from .rewrite import op_def_lookup

ROUND_OP_TYPE = "RoundToHalf"
HALF_TYPE_ATTR = "half_type"
_HALF_KINDS = frozenset({DT_HALF, DT_BFLOAT16})


@dataclass
class RoundingOps:
    """What ``use_rounding_op`` changed in one graph (its function bodies included)."""

    replaced: int = 0        # rounding Cast pairs now one RoundToHalf node each
    narrowing_kept: int = 0  # first Casts of those pairs kept (the pass's, or read by half nodes)
    kept_on_gpu: int = 0     # pairs left as Casts because they are placed on a GPU
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
    """Replaces the pairs of one graph; returns how many (``renamed`` gets W:0 -> R:0)."""
    nodes = {node.name: node for node in graph_def.node}
    readers: Dict[str, int] = {}
    for node in graph_def.node:
        for text in node.input:
            name = parse_input(text)[0]
            readers[name] = readers.get(name, 0) + 1
    taken = set(nodes)
    replacement: Dict[str, node_def_pb2.NodeDef] = {}  # W's name -> R
    removed = set()
    for node in graph_def.node:
        narrow = _narrowing_cast_of_pair(node, nodes)
        if narrow is None:
            continue
        if "GPU" in device_type(node.device):
            result.kept_on_gpu += 1
            continue
        replacement[node.name] = _rounding_node(narrow, node, taken)
        removed.add(node.name)
        if readers[narrow.name] == 1 and is_emulation_cast(narrow):
            removed.add(narrow.name)
        else:
            result.narrowing_kept += 1
    if not replacement:
        return 0
    kept = []
    for node in graph_def.node:
        if node.name in replacement:
            kept.append(replacement[node.name])
        elif node.name not in removed:
            kept.append(node)
            _rewire(node, replacement)
    del graph_def.node[:]
    graph_def.node.extend(kept)
    result.replaced += len(replacement)
    if renamed is not None:
        renamed.update({old + ":0": new.name + ":0" for old, new in replacement.items()})
    return len(replacement)


def _narrowing_cast_of_pair(node, nodes) -> Optional[object]:
    """N when ``node`` is the W of a rounding pair ``N = Cast(x, half) -> W = Cast(N, float32)``:
    W one of emulation's Casts, N one of emulation's or the pass's (module docstring)."""
    if not is_emulation_cast(node) or node.attr["DstT"].type != DT_FLOAT:
        return None
    half = node.attr["SrcT"].type
    name, port = parse_input(node.input[0])
    narrow = nodes.get(name)
    if half not in _HALF_KINDS or port != 0 or narrow is None or narrow.op != "Cast":
        return None
    if not narrow.name.endswith(CAST_SUFFIX) or narrow.attr["Truncate"].b:
        return None
    if narrow.attr["SrcT"].type != DT_FLOAT or narrow.attr["DstT"].type != half:
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


def _rewire(node, replacement: Dict[str, node_def_pb2.NodeDef]) -> None:
    """Points ``node``'s inputs from each replaced W to its R (a W has one output)."""
    for slot, text in enumerate(node.input):
        name, port = parse_input(text)
        if name in replacement:
            new = replacement[name].name
            node.input[slot] = "^" + new if port < 0 else new

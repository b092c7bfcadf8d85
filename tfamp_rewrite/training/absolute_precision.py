"""Values whose absolute error shows, computed in half: angles and indices, said once.

float16 keeps 11 significant bits: its spacing is 1 past 1024 and 8 past 8192.  Most
values only need their relative precision, but three kinds need their absolute one:

* an angle a periodic function reads (``Sin``, ``Cos``, ``Tan``): a position or time
  encoding's ``sin(t @ freqs)`` with t up to 10000 (Time2Vec, Transformer-XL's
  ``einsum('i,j->ij', pos, inv_freq)``, random Fourier features) loses its phase where
  the MatMul or Einsum computing the angles runs in half (an angle an elementwise chain
  computes, a pendulum's ``th + dt * om`` in radians, keeps its relative precision: unsaid);
* a position cast to integer indices of a gather or scatter: a bilinear sampler's pixel
  coordinates from a homogeneous MatMul lose their fraction past 1024 (the interpolation
  weight is 0), integers past 2048 are no longer exact;
* a convergence test deciding a TF1 while loop (``err > 1e-6`` on PageRank's iterates): a
  half MatMul's iterates change by a part in 2048 and stall above the tolerance, and the
  loop runs to its cap or for ever.

TensorFlow's pass converts those MatMuls alike, and they compute no inf: nothing fails,
the results are just worse.  ``half_absolute_reads`` finds the readers whose value a
converted node computes, and the session says the first of each kind once, with the
converted nodes to keep float32 (half_writes.py's walk: past nodes that only pass values
on, to those that round).
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, List, NamedTuple, Tuple

from ..graph_rewrite.graph_view import parse_input
from .devices import log_once, nodes_to_exclude_setting
from .half_writes import PASS_THROUGH

PERIODIC = frozenset({"Sin", "Cos", "Tan"})
# Ops reading integer indices, and which input: their kernels reject one out of bounds on
# the CPU ("indices[2] = 2048 is not in [0, 2048)"); a GPU's gather returns zeros instead.
INDICES_INPUT = {"Gather": 1, "GatherV2": 1, "GatherNd": 1, "ResourceGather": 1,
                 "ResourceGatherNd": 1, "ScatterNd": 0, "TensorScatterUpdate": 1,
                 "TensorScatterAdd": 1, "UnsortedSegmentSum": 1, "UnsortedSegmentMax": 1,
                 "UnsortedSegmentMin": 1, "OneHot": 0}
# integer arithmetic between a cast and the gather it indexes (x0 + 1, a clip to the image)
_INTEGER_STEPS = frozenset({"Add", "AddV2", "Sub", "Mul", "Minimum", "Maximum", "ClipByValue",
                            "Reshape", "ExpandDims", "Squeeze", "Pack", "ConcatV2", "StridedSlice",
                            "Identity", "Tile", "Transpose"})
# a floor or round passes its input's rounding on to the index it makes
_ROUNDINGS = frozenset({"Floor", "Ceil", "Round", "Rint"})
_INTEGER_TYPES = frozenset({3, 9})  # types_pb2.DT_INT32, DT_INT64
_DT_FLOAT = 1
_MOST_STEPS = 8
_PRODUCTS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})
_BIAS_ADDS = frozenset({"BiasAdd", "Add", "AddV2"})
_COMPARISONS = frozenset({"Less", "Greater", "LessEqual", "GreaterEqual"})
_LOGICAL = frozenset({"LogicalAnd", "LogicalOr", "LogicalNot", "Identity"})
_MOST_WALKED = 64  # nodes up from a loop condition's comparison to the converted ones
ANGLE, INDEX, TOLERANCE = "angle", "index", "tolerance"


class AbsoluteRead(NamedTuple):
    """A user node (``reader``, of type ``op``) that needs a value's absolute precision, the
    value a converted node ``computed_by`` computes; ``keep``: the converted nodes to keep
    float32 for it to read float32's value."""

    kind: str
    reader: str
    op: str
    computed_by: str
    keep: Tuple[str, ...]


def half_absolute_reads(nodes: Iterable, node_by_name: Callable, converted: Callable,
                        readers_of: Callable) -> List[AbsoluteRead]:
    """The angles and indices among ``nodes`` (NodeDefs of the user graph) that a converted
    node computes: ``node_by_name(name)`` gives a NodeDef (or None), ``converted(name)``
    whether the rewrite converted it, ``readers_of(name)`` the NodeDefs reading its outputs."""
    found = []
    for node in nodes:
        if node.op == "LoopCond":
            found += _tolerances(node, node_by_name, converted)
            continue
        if node.op in PERIODIC and not converted(node.name) and node.input:
            kind = ANGLE
        elif (node.op == "Cast" and node.attr["SrcT"].type == _DT_FLOAT
              and node.attr["DstT"].type in _INTEGER_TYPES and _indexes(node, readers_of)):
            kind = INDEX
        else:
            continue
        path = _product_path(parse_input(node.input[0])[0], node_by_name, converted)
        if path:
            found.append(AbsoluteRead(kind, node.name, node.op, path[-1],
                                      tuple(name for name in path if converted(name))))
    return found


def _product_path(name: str, node_by_name: Callable, converted: Callable) -> List[str]:
    """The nodes from ``name`` up to a converted product (a MatMul, an Einsum) that computes
    the value, past nodes that only pass values on or round them, and at most one bias
    added; empty where none does.  A product's sums reach the thousands (t @ freqs + b,
    [x y 1] @ A); an elementwise chain (a pendulum's th + dt * om, in radians, its om from a
    half controller) keeps its relative precision."""
    path: List[str] = []
    node, biased = node_by_name(name), False
    while node is not None and len(path) < _MOST_STEPS:
        path.append(node.name)
        if node.op in _PRODUCTS:
            return path if converted(node.name) else []
        inputs = [node_by_name(parse_input(text)[0]) for text in node.input if not text.startswith("^")]
        if node.op in _BIAS_ADDS and not biased:
            biased = True
            products = [each for each in inputs if each is not None and each.op in _PRODUCTS]
            node = products[0] if products else None
        elif node.op in PASS_THROUGH or node.op in _ROUNDINGS:
            node = inputs[0] if inputs else None
        else:
            return []
    return []


def _tolerances(loop_cond, node_by_name: Callable, converted: Callable) -> List[AbsoluteRead]:
    """The float comparisons deciding a TF1 while loop (``loop_cond``) whose operands
    converted nodes inside the loop compute: a convergence test ``err > 1e-6`` on a half
    PageRank never passes, as float16 changes by a part in 2048."""
    comparisons, stack, seen = [], [parse_input(loop_cond.input[0])[0]], set()
    while stack:
        node = node_by_name(stack.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op in _COMPARISONS and node.attr["T"].type == _DT_FLOAT:
            comparisons.append(node)
        elif node.op in _LOGICAL or node.op in ("Merge", "Switch"):
            stack.extend(parse_input(text)[0] for text in node.input if not text.startswith("^"))
    found = []
    for comparison in comparisons:
        stack = [parse_input(text)[0] for text in comparison.input if not text.startswith("^")]
        half, walked = [], set()
        while stack and len(walked) < _MOST_WALKED:
            node = node_by_name(stack.pop())
            if node is None or node.name in walked or node.op in ("Enter", "RefEnter"):
                continue  # an Enter's value comes from outside the loop
            walked.add(node.name)
            if converted(node.name):
                half.append(node.name)
            stack.extend(parse_input(text)[0] for text in node.input if not text.startswith("^"))
        computing = [name for name in half if node_by_name(name).op not in PASS_THROUGH]
        if computing:
            found.append(AbsoluteRead(TOLERANCE, comparison.name, comparison.op, computing[0],
                                      tuple(sorted(computing))))
    return found


def _indexes(cast, readers_of: Callable) -> bool:
    """Whether the integers ``cast`` makes reach a gather's or scatter's indices, through
    integer arithmetic (``_MOST_STEPS`` ops at most)."""
    frontier, seen = [cast], {cast.name}
    for _ in range(_MOST_STEPS):
        following = []
        for node in frontier:
            for reader in readers_of(node.name):
                position = INDICES_INPUT.get(reader.op)
                if position is not None and len(reader.input) > position and \
                        parse_input(reader.input[position])[0] == node.name:
                    return True
                if reader.op in _INTEGER_STEPS and reader.name not in seen:
                    seen.add(reader.name)
                    following.append(reader)
        frontier = following
    return False


_WHY = {
    ANGLE: "takes the %(function)s of an angle %(dtype)s computes (%(node)r, %(op)s, converted): "
           "the angle rounds to %(dtype)s's spacing, 1 past 1024 and 8 past 8192, so a position or "
           "time encoding's phase is lost (sin(t @ freqs) for t in the thousands)",
    INDEX: "makes integer indices of a position %(dtype)s computes (%(node)r, %(op)s, converted): "
           "past 1024 the position rounds to whole units, so a bilinear sampler's fraction and "
           "weights are lost (a sub-pixel shift moves nothing), and past 2048 integers are not exact",
    TOLERANCE: "decides a while loop by comparing a value %(dtype)s computes (%(node)r, %(op)s, "
               "converted) with a bound: a convergence test may never pass, as %(dtype)s's values "
               "change by a part in 2048 and its iterates stall above a tolerance such as 1e-6 "
               "(the loop runs to its cap, or for ever)",
}


def say_absolute_reads(reads: List[AbsoluteRead], dtype: str, op_of: Callable) -> None:
    """Says the first read of each kind in ``reads``, once per process and kind;
    ``op_of(name)``: a user node's op type."""
    for kind in (ANGLE, INDEX, TOLERANCE):
        of_kind = [read for read in reads if read.kind == kind]
        if not of_kind:
            continue
        first, others = of_kind[0], len(of_kind) - 1
        keep: List[str] = []
        for read in of_kind:
            keep += [name for name in read.keep if name not in keep]
        what = _WHY[kind] % {"function": first.op.lower(), "dtype": dtype, "node": first.computed_by,
                             "op": op_of(first.computed_by)}
        log_once("tfamp_rewrite: %r %s%s. TensorFlow's pass converts it alike, and nothing fails: "
                 "keep %s float32 with %s (said once)" % (
                     first.reader, what,
                     " (and %d more such read%s)" % (others, "s" if others > 1 else "") if others else "",
                     "it" if len(keep) == 1 else "the %d nodes computing and passing it on" % len(keep),
                     nodes_to_exclude_setting(["^%s$" % re.escape(name) for name in keep])),
                 key="half %s read" % kind)

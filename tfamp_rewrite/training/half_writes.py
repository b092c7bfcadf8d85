"""Variables a rewrite makes store half values: said once, with the node to keep float32.

An assignment stores its value whole: where the rewrite converts the node computing it, a
float32 variable holds float16's 11 significant bits after every such write.  A weighted
average of weights through ``tf.tensordot`` (federated averaging's server update: its
MatMul is on the allow list) is off by a part in 2048 each round, about the size of the
updates it averages; a hand-written ``tf.assign(w, w - lr * g)`` whose subtraction follows
a half gradient loses every step smaller than that.  TensorFlow's own pass converts these
nodes alike and says nothing; ``half_written_variables`` finds them, and the session says
the first (``say_half_writes``).  Increments (``assign_add``, an optimizer's ``Apply*``)
are left out: a rounded step changes the variable by a rounded step, not its stored value.

The node to keep float32 is the one that rounds: past converted nodes that only pass values
on (a running maximum's ``Maximum`` and ``Max`` over a ``Relu`` of a half ``MatMul``), to
the nodes computing new ones; every converted node on the way is kept with them, as each
would round the float32 value to half again.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, List, NamedTuple, Tuple

from ..graph_rewrite.graph_view import parse_input
from .devices import log_once, nodes_to_exclude_setting

_STORES = {"Assign": 1, "AssignVariableOp": 1}  # op -> the input it stores
STORE_OPS = frozenset(_STORES)
_DTYPE_ATTR = {"Assign": "T", "AssignVariableOp": "dtype"}
_DT_FLOAT = 1  # types_pb2.DT_FLOAT
# ops whose outputs are among their inputs' values (they round nothing of their own): the
# write names the node computing the value, past them
# a TF1 loop's or cond's value passes through its frame's nodes
_FRAME = frozenset({"Enter", "RefEnter", "Exit", "RefExit", "Merge", "RefMerge", "Switch", "RefSwitch",
                    "NextIteration", "RefNextIteration"})
PASS_THROUGH = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims", "Transpose", "Relu", "Relu6",
                          "Maximum", "Minimum", "Max", "Min", "ClipByValue", "Abs", "Neg", "Select",
                          "SelectV2", "ConcatV2", "Pack", "Slice", "StridedSlice", "GatherV2",
                          "Tile"}) | _FRAME


# float32 ops that scale a value, keeping its relative error: EM's M-step stores
# matmul(r, x) / n, the half MatMul's rounding scaled (the division itself rounds nothing)
_SCALING = frozenset({"Mul", "RealDiv", "Div", "Neg"})
_SUMS = frozenset({"Add", "AddV2", "Sub", "AddN"})
_READS = frozenset({"Identity", "ReadVariableOp"})


class HalfWrite(NamedTuple):
    """An assignment (user graph names) storing a value the converted node ``computed_by``
    computes (``op`` its type) in the variable it writes; ``keep``: the converted nodes to
    keep float32 for it to store float32's value (``computed_by``, the others computing it,
    and those passing it on)."""

    assignment: str
    variable: str
    computed_by: str
    op: str
    keep: Tuple[str, ...] = ()


def half_written_variables(nodes: Iterable, node_by_name: Callable,
                           converted: Callable) -> List[HalfWrite]:
    """The assignments among ``nodes`` (NodeDefs of the user graph) whose stored value a
    converted node computes: ``node_by_name(name)`` gives a NodeDef (or None),
    ``converted(name)`` whether the rewrite converted it."""
    found = []
    for node in nodes:
        index = _STORES.get(node.op)
        if index is None or len(node.input) <= index:
            continue
        if node.attr[_DTYPE_ATTR[node.op]].type != _DT_FLOAT:
            continue  # only a float32 variable loses bits this way
        keep, computing = rounding_upstream(parse_input(node.input[index])[0], node_by_name, converted,
                                            variable=parse_input(node.input[0])[0])
        if computing:
            found.append(HalfWrite(node.name, parse_input(node.input[0])[0], computing[0].name,
                                   computing[0].op, tuple(keep)))
    return found


def rounding_upstream(name: str, node_by_name: Callable, converted: Callable, passing=PASS_THROUGH,
                      variable: str = None):
    """``(keep, computing)`` for the value node ``name`` computes: the converted nodes up from
    it through those passing values on (``passing``), converted sums (which round, and pass
    their summands' rounding on), float32 scalings (``_SCALING``) and float32 sums
    (``_SUMS``) -- but a sum with the stored ``variable`` itself, an increment -- all of
    them, in walk order; and the NodeDefs of those among them that compute new values
    (which round to half)."""
    keep, computing, stack, seen = [], [], [name], set()
    while stack:
        node = node_by_name(stack.pop(0))
        if node is None or node.name in seen:
            continue
        if not converted(node.name):
            # a float32 scaling keeps the half value's relative error; a TF1 loop's frame
            # passes the body's value out (an EM M-step iterated in a while loop); a sum adds
            # a term to it (PageRank's 0.85 * M @ r + 0.15 / n), unless it adds to the variable
            if node.op in _SCALING or node.op in _FRAME or node.op == "Identity" or (
                    node.op in _SUMS and not _reads_directly(node, variable, node_by_name)):
                seen.add(node.name)
                stack.extend(parse_input(text)[0] for text in node.input if not text.startswith("^"))
            continue
        seen.add(node.name)
        keep.append(node.name)
        if node.op in passing:
            stack.extend(parse_input(text)[0] for text in node.input if not text.startswith("^"))
        else:
            computing.append(node)
            if node.op in _SUMS:  # a sum passes on its summands' rounding too: an unrolled
                # carry theta + f(theta) keeps every step's half theta unless all are kept
                stack.extend(parse_input(text)[0] for text in node.input if not text.startswith("^"))
    return keep, computing


def _reads_directly(node, variable: str, node_by_name: Callable) -> bool:
    """Whether an input of ``node`` is ``variable`` (a name) or a read of it."""
    if variable is None:
        return False
    for text in node.input:
        if text.startswith("^"):
            continue
        source = node_by_name(parse_input(text)[0])
        if source is not None and (source.name == variable or (
                source.op in _READS and source.input and parse_input(source.input[0])[0] == variable)):
            return True
    return False


def say_half_writes(writes: List[HalfWrite], dtype: str) -> None:
    """Says the first of ``writes``, once per process and variable (a write to it built again
    for validation, TBPTT's state carry, is not said again)."""
    if not writes:
        return
    first, others = writes[0], len(writes) - 1
    more = " (and %d more assignment%s)" % (others, "s" if others > 1 else "") if others else ""
    keep = []
    for write in writes:
        keep += [name for name in write.keep or (write.computed_by,) if name not in keep]
    fix = nodes_to_exclude_setting(["^%s$" % re.escape(name) for name in keep])
    log_once("tfamp_rewrite: %r stores in float32 variable %r a value %s computes (%r, %s, "
             "converted)%s: the variable holds %s's precision after each such write (a part in "
             "%d: a weighted average of weights, a running maximum, an update w - lr * g whose "
             "smaller steps round away). Keep %s float32 with %s (said once)" % (
                 first.assignment, first.variable, dtype, first.computed_by, first.op, more, dtype,
                 2048 if dtype == "float16" else 256,
                 "it" if len(keep) == 1 else "the %d nodes computing and passing on such values" % len(keep),
                 fix), key="half write to " + first.variable)

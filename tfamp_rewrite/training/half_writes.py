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
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, List, NamedTuple

from ..graph_rewrite.graph_view import parse_input
from .devices import log_once, nodes_to_exclude_setting

_STORES = {"Assign": 1, "AssignVariableOp": 1}  # op -> the input it stores
STORE_OPS = frozenset(_STORES)
_DTYPE_ATTR = {"Assign": "T", "AssignVariableOp": "dtype"}
_DT_FLOAT = 1  # types_pb2.DT_FLOAT
# ops that pass a value on unchanged: the write names the node computing it
_PASS_THROUGH = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims"})


class HalfWrite(NamedTuple):
    """An assignment (user graph names) storing a value the converted node ``computed_by``
    computes (``op`` its type) in the variable it writes."""

    assignment: str
    variable: str
    computed_by: str
    op: str


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
        producer = node_by_name(parse_input(node.input[index])[0])
        while (producer is not None and producer.op in _PASS_THROUGH and converted(producer.name)
               and producer.input):
            producer = node_by_name(parse_input(producer.input[0])[0])
        if producer is not None and converted(producer.name):
            found.append(HalfWrite(node.name, parse_input(node.input[0])[0], producer.name, producer.op))
    return found


def say_half_writes(writes: List[HalfWrite], dtype: str) -> None:
    """Says the first of ``writes``, once per process."""
    if not writes:
        return
    first, others = writes[0], len(writes) - 1
    more = " (and %d more assignment%s)" % (others, "s" if others > 1 else "") if others else ""
    fix = nodes_to_exclude_setting(["^%s$" % re.escape(first.computed_by)])
    log_once("tfamp_rewrite: %r stores in float32 variable %r a value %s computes (%r, %s, "
             "converted)%s: the variable holds %s's precision after each such write (a part in "
             "%d: a weighted average of weights, an update w - lr * g whose smaller steps round "
             "away). Keep it float32 with %s (said once)" % (
                 first.assignment, first.variable, dtype, first.computed_by, first.op, more, dtype,
                 2048 if dtype == "float16" else 256, fix))

"""Reads of TF1 reference variables kept in the order their readers wait for.

A TF1 variable (``tf.Variable``, ``tf.get_variable`` without ``use_resource``) is read
through ``w/read``, an Identity that forwards the variable's buffer itself: an op computed
from it sees the value the variable holds when that op runs.  So a reader that waits on a
write of the variable -- ``with tf.control_dependencies([tf.assign(P, new)]): tf.matmul(P,
x)``, an alternating GAN's generator step under ``control_dependencies([d_step])``, ALS's
second half-step -- sees the written value.  The rewrite reads the variable through a Cast
(or emulation's rounding) instead, which copies the value when *it* runs: nothing makes it
wait for the write, so the reader saw the old value in some runs and the new in others.
(TensorFlow's own pass inserts its Casts the same way.)

``order_reads_after_writes(graph_def, user_names)`` gives each such reader its own copy of
the added node, which waits on what the reader waits on: the producers of its other inputs
and its control inputs.  It changes nothing where no reader of an added node comes after a
write of the variable (a training step's forward and backward passes read before the
update), and returns the readers it changed.
"""
from __future__ import annotations

from typing import Collection, Dict, List, Set

from ..graph_rewrite.graph_view import parse_input
from .state_guard import variable_of

_REF_VARIABLES = {"VariableV2", "Variable"}
_PASSING = {"Identity", "RefIdentity"}
_SCOPE = "/tfamp_ordered_read_"  # a reader's own copy: "<reader>/tfamp_ordered_read_<slot>"


def order_reads_after_writes(graph_def, user_names: Collection[str]) -> List[str]:
    """Rewires, in place, each reader of a node ``graph_def`` added to the user's nodes
    (``user_names``) from a reference variable's value, that runs after a write of that
    variable, to a copy of the added node waiting on what the reader waits on (module
    docstring); returns the readers' names."""
    by_name = {node.name: node for node in graph_def.node}
    read_of = {}  # added node -> the reference variable its input is the value of
    for node in graph_def.node:
        if node.name not in user_names and node.input:
            variable = _reference_variable(node.input[0], by_name)
            if variable is not None:
                read_of[node.name] = variable
    if not read_of:
        return []
    writes: Dict[str, List[str]] = {}
    for node in graph_def.node:
        if node.input and _is_write(node):
            variable = variable_of(node.input[0], by_name)
            if variable in set(read_of.values()):
                writes.setdefault(variable, []).append(node.name)
    if not writes:
        return []
    consumers = _consumers(graph_def)
    after = {variable: _downstream(names, consumers) for variable, names in writes.items()}
    ordered = []
    for node in list(graph_def.node):
        if node.name in read_of:
            continue
        for slot, text in enumerate(node.input):
            source = parse_input(text)[0] if not text.startswith("^") else None
            variable = read_of.get(source)
            if variable is None or node.name not in after.get(variable, ()):
                continue
            copy = type(by_name[source])()
            copy.CopyFrom(by_name[source])
            copy.name = "%s%s%d" % (node.name, _SCOPE, slot)
            waits = ["^" + parse_input(other.lstrip("^"))[0] for index, other in enumerate(node.input)
                     if index != slot and parse_input(other.lstrip("^"))[0] != source]
            copy.input.extend(sorted(set(waits)))
            graph_def.node.extend([copy])
            port = parse_input(text)[1]
            node.input[slot] = copy.name if port == 0 else "%s:%d" % (copy.name, port)
            ordered.append(node.name)
    return ordered


def _reference_variable(text: str, by_name) -> str:
    """The reference variable whose value input ``text`` is, through identities, or None."""
    node = by_name.get(parse_input(text)[0])
    while node is not None and node.op in _PASSING and node.input:
        node = by_name.get(parse_input(node.input[0])[0])
    return node.name if node is not None and node.op in _REF_VARIABLES else None


def _is_write(node) -> bool:
    return node.op.startswith(("Assign", "Scatter", "Apply", "SparseApply")) or node.op in (
        "StridedSliceAssign", "CountUpTo")


def _consumers(graph_def) -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            found.setdefault(parse_input(text.lstrip("^"))[0], []).append(node.name)
    return found


def _downstream(names: List[str], consumers) -> Set[str]:
    """The nodes computed after ``names`` (through data and control edges), themselves not."""
    seen: Set[str] = set()
    stack = [c for name in names for c in consumers.get(name, ())]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(consumers.get(name, ()))
    return seen

"""Assertions that wait for the loss scaling, in the graph a session runs.

An exploding-gradient guard (``tf.debugging.assert_less(tf.global_norm(grads), 1e6)``,
``tf.Assert(tf.reduce_all(tf.is_finite(g)), ["bad gradient"])``) fails the whole run when its
condition is false.  Under loss scaling a skipped step's gradients are inf or nan by design,
and a half forward value may overflow where float32's did not; so such an assertion fails
runs float32 passes.  Like ``check_numerics`` (check_deferral.py), in the copy of the user's
graph a rewriting session imports, each ``Assert`` that ``deferrable(name)`` accepts (the
session's: ``waits_for_the_loss_scaling``, a condition a half node or a backward pass lies
upstream of) keeps its name and its consumers but formats its data instead of failing::

    Assert(condition, data...)  ->  StringFormat(data...)   (the values TensorFlow's message
                                                             shows, joined by SEPARATOR)
    name/tfamp_check/status   = Pack([failed, failed])      (a check's status shape)
    name/tfamp_check/message  = the formatted data, "" where it passed

An ``Assert`` with other than string or int32 data runs in TensorFlow's "AssertGuard" cond,
only where its condition is false: there ``message`` merges the formatted data with an empty
string from the guard's true branch, and ``failed`` is whether the false branch ran, so the
data is formatted only in a run that fails.  An unguarded ``Assert`` formats its (small,
host) data in every run and ``failed = LogicalNot(condition)``.  An ``Assert`` in a cond of
the user's, or in a guard of another shape, stays TensorFlow's.

The session judges the statuses after each run (deferred_checks.py) and raises TensorFlow's
"assertion failed: [...]" from ``failure_message`` where it must -- at once where the values
an assertion shows are all finite (``shows_floats``, ``shows_non_finite``), which no skipped
step explains.  The formatting is ``tf.strings.format``'s (numpy-like, ``summarize`` items at
each end of each dimension), not the Assert kernel's.
"""
from __future__ import annotations

import re
from typing import Callable, List, Optional

from tensorflow.core.framework import tensor_pb2, types_pb2

from ..doctor.probes import INTEGER_RESULTS
from ..graph_rewrite.graph_view import parse_input
from .check_deferral import SCOPE
from .node_defs import node_def
from .op_walks import reachable
from .unscaled_training import GRADIENT_SCOPE

ASSERT_OP = "Assert"
MESSAGE = SCOPE + "message"  # an assertion's formatted data: its name + MESSAGE
_NON_FINITE_VALUE = re.compile(r"(?<![\w.])-?(inf|nan)(?![\w])", re.IGNORECASE)
SEPARATOR = "\x1f"  # between the data items of a message: a character values rarely hold
_ROW_BREAK = re.compile(r"\n\s*")  # tf.strings.format starts each row of a matrix on a line


def defer_assertions(graph_def, deferrable: Callable[[str], bool]) -> List[str]:
    """Turns, in place, each ``Assert`` of ``graph_def`` that ``deferrable(name)`` accepts
    into a ``StringFormat`` of its data with a status and a message beside it (module
    docstring); returns their names."""
    by_name = {node.name: node for node in graph_def.node}
    deferred = []
    for node in list(graph_def.node):
        if node.op != ASSERT_OP or not deferrable(node.name):
            continue
        guard_true = _guard_true_branch(node, by_name)
        if guard_true is None and by_name.get(parse_input(node.input[0])[0], node).op == "Switch":
            continue  # in a cond of the user's
        scope = node.name + SCOPE
        condition = node.input[0]
        data = [text for text in node.input[1:] if not text.startswith("^")]
        controls = [text for text in node.input[1:] if text.startswith("^")]
        summarize = node.attr["summarize"].i
        types = list(node.attr["T"].list.type)
        node.op = "StringFormat"
        node.ClearField("attr")
        node.attr["T"].list.type.extend(types)
        node.attr["template"].s = SEPARATOR.join(["{}"] * len(data)).encode()
        node.attr["placeholder"].s = b"{}"
        node.attr["summarize"].i = summarize
        del node.input[:]
        node.input.extend(data + controls)
        node.device = ""  # StringFormat has CPU kernels only
        added = [node_def(scope + "zero", "Const", [], _int32_zero())]
        if guard_true is None:
            added.append(node_def(scope + "message", "Identity", [node.name], T=types_pb2.DT_STRING))
            added.append(node_def(scope + "failed", "LogicalNot", [condition]))
        else:
            added.append(node_def(scope + "passed_message", "Const", ["^" + guard_true], _empty_string()))
            added.append(node_def(scope + "message", "Merge", [node.name, scope + "passed_message"],
                                  ints={"N": 2}, T=types_pb2.DT_STRING))
            added.append(node_def(scope + "failed", "Equal", [scope + "message:1", scope + "zero"],
                                  T=types_pb2.DT_INT32))
        added.append(node_def(scope + "status", "Pack", [scope + "failed", scope + "failed"],
                              ints={"N": 2}, T=types_pb2.DT_BOOL))
        graph_def.node.extend(added)
        deferred.append(node.name)
    return deferred


def waits_for_the_loss_scaling(op, half: Callable[[str], bool]) -> bool:
    """Whether the user graph's ``op`` (an Assert) is one to defer: outside TF1 control flow
    but its own guard, with a condition computed from values the loss scaling or the
    rewrite can make inf/nan -- a loss-scaled backward pass's (ops under a ``gradients``
    scope) or a node ``half(name)`` accepts (the rewrite converts it).  One on shapes,
    counts, strings or float32 values alone (a fed batch's finiteness) fails where
    float32's does, and stays TensorFlow's."""
    context = op._get_control_flow_context()
    if context is not None and context.outer_context is not None:
        return False
    condition = op.inputs[0]
    while condition.op.type == "Switch":  # the guard's (defer_assertions checks its shape)
        condition = condition.op.inputs[0]
    if condition.op._get_control_flow_context() is not None:
        return False
    return any(half(each.name) or GRADIENT_SCOPE.search(each.name)
               for each in values_upstream([condition.op]))


def values_upstream(ops) -> set:
    """The operations computing floating values that ``ops`` are computed from, short of a
    shape: a Shape, Size or Rank gives integers whatever its input holds (and the rewrite
    counts a Shape of a half tensor as converted too)."""
    upstream = reachable(ops, lambda each: [] if each.type in INTEGER_RESULTS
                         else [t.op for t in each.inputs])
    return {each for each in upstream if each.type not in INTEGER_RESULTS
            and any(output.dtype.base_dtype.is_floating for output in each.outputs)}


def shows_floats(op) -> bool:
    """Whether the user graph's Assert ``op`` shows floating-point values among its data
    (``tf.Assert(all_finite, ["gradients are not finite"])`` shows none)."""
    return any(dtype.is_floating for dtype in op.get_attr("T"))


def shows_non_finite(message: str) -> bool:
    """Whether an assertion's ``failure_message`` shows an inf or nan among its values: a
    failure on finite values alone (a probability above 1, a norm past its bound) is no
    skipped step's doing."""
    return bool(_NON_FINITE_VALUE.search(message))


def failure_message(formatted: bytes) -> str:
    """TensorFlow's message for an assertion whose data ``formatted`` (a message tensor's
    value) shows: each item in brackets, a string's without its quotes, a matrix's rows on
    the one line (as the Assert kernel keeps them: the values follow "assertion failed")."""
    text = formatted.decode("utf-8", "replace")
    items = text.split(SEPARATOR) if text else []
    return "assertion failed: " + " ".join(
        _ROW_BREAK.sub(" ", item) if item.startswith("[") else _bracketed(item) for item in items)


def _bracketed(item: str) -> str:
    if len(item) >= 2 and item[0] == item[-1] == '"':
        return "[%s]" % item[1:-1]
    return item if item.startswith("[") else "[%s]" % item


def _guard_true_branch(node, by_name) -> Optional[str]:
    """The ``switch_t`` of the "AssertGuard" cond ``node`` (an Assert) runs in -- the cond
    that runs it where its condition is false -- or None when it runs in none."""
    switch = by_name.get(parse_input(node.input[0])[0])
    if switch is None or switch.op != "Switch" or len(switch.input) < 2:
        return None
    pred = by_name.get(parse_input(switch.input[1])[0])
    source = switch.input[0]
    if pred is None or pred.op != "Identity" or pred.input[0] != source:
        return None  # a cond on another predicate: the user's
    guard_true = by_name.get(node.name.rsplit("/", 1)[0] + "/switch_t")
    if guard_true is None or guard_true.op != "Identity":
        return None
    guard_switch = by_name.get(parse_input(guard_true.input[0])[0])
    if guard_switch is None or guard_switch.op != "Switch" or guard_switch.input[:2] != [source, source]:
        return None
    return guard_true.name


def _int32_zero():
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, int_val=[0], tensor_shape={})


def _empty_string():
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b""], tensor_shape={})

"""``check_numerics`` that waits for the loss scaling, in the graph a session runs.

TensorFlow's ``CheckNumerics`` (``tf.debugging.check_numerics``, ``tf.verify_tensor_all_finite``,
``tf.add_check_numerics_ops``) fails the whole run on an inf or nan.  Under loss scaling a
skipped step's gradients are inf or nan by design, and a half forward value may overflow
where float32's did not -- which the session names and heals a few steps later, if the run
gets to finish.  So in the copy of the user's graph that a rewriting session imports, when
that graph holds a loss-scaled step, each ``CheckNumerics`` becomes an ``Identity`` (same
name, same consumers) with a status beside it::

    status = Pack([Any(IsNan(flat)), Any(IsInf(flat))])      flat = Reshape(input, [-1])

``defer_checks(graph_def, deferrable)`` makes that change in place, for the checks
``deferrable`` accepts: those outside a TF1 cond or while loop, whose status a run can
fetch.  The session judges the statuses after each run (deferred_checks.py).

A failing check stopped the run before anything computed from it: a running mean updated
from a checked batch mean kept its value, and the program dropped the batch.  So each
write to a variable computed from deferred checks or assertions (assertion_deferral.py;
through data or control inputs; one that
``deferrable`` accepts, and none that only an applied step runs) writes nothing where one
of them saw inf/nan (``hold_checked_writes``)::

    Assign(v, x)   x -> Select(passed, x, v)     passed = All(Pack([Not(Any(status)), ...]))

(and the other writes state_guard.py guards, each keeping what it would change).  The
writes only an applied step runs are the step's: a loss-scaled step computed from deferred
checks (an exploding-gradient guard under ``control_dependencies`` before
``apply_gradients``) applies only where they passed (``hold_checked_steps``).  The user's
graph is not changed.
"""
from __future__ import annotations

from typing import Callable, Collection, List, Set

from tensorflow.core.framework import types_pb2

from ..graph_rewrite.graph_view import parse_input
from .node_defs import flattened, node_def
from .state_guard import WRITE_OPS, keeping_write, write_selected

_CHECK_OP = "CheckNumerics"
SCOPE = "/tfamp_check/"
STATUS = SCOPE + "status"  # a check's status node: its name + STATUS


def defer_checks(graph_def, deferrable: Callable[[str], bool]) -> List[str]:
    """Turns, in place, each ``CheckNumerics`` of ``graph_def`` that ``deferrable(name)``
    accepts into an ``Identity`` with a status beside it (module docstring); returns their
    names."""
    deferred = []
    for node in list(graph_def.node):
        if node.op != _CHECK_OP or not deferrable(node.name):
            continue
        values, dtype, scope = node.input[0], node.attr["T"].type, node.name + SCOPE
        nodes = flattened(values, dtype, scope)
        flat = scope + "flat"
        if dtype == types_pb2.DT_BFLOAT16:  # IsNan/IsInf lack bfloat16 kernels in older TensorFlow
            nodes.append(node_def(scope + "widened", "Cast", [flat], SrcT=dtype, DstT=types_pb2.DT_FLOAT))
            flat, dtype = scope + "widened", types_pb2.DT_FLOAT
        for test in ("IsNan", "IsInf"):
            nodes.append(node_def(scope + test, test, [flat], T=dtype))
            nodes.append(node_def(scope + "any_" + test, "Any", [scope + test, scope + "zero"],
                                  Tidx=types_pb2.DT_INT32))
        nodes.append(node_def(scope + "status", "Pack", [scope + "any_IsNan", scope + "any_IsInf"],
                              ints={"N": 2}, T=types_pb2.DT_BOOL))
        for added in nodes:
            added.device = node.device
        graph_def.node.extend(nodes)
        node.op = "Identity"
        del node.attr["message"]
        deferred.append(node.name)
    return deferred


def hold_checked_writes(graph_def, deferred: Collection[str], deferrable: Callable[[str], bool],
                        leave: Collection[str] = ()) -> List[str]:
    """Makes, in place, each write of ``graph_def`` computed from the ``deferred`` checks
    (through data or control inputs), that ``deferrable(name)`` accepts and ``leave`` does
    not name, write nothing when one of those checks saw inf/nan (module docstring);
    returns the writes' names."""
    by_name = {node.name: node for node in graph_def.node}
    deferred = set(deferred)
    held = []
    for node in list(graph_def.node):
        if node.op not in WRITE_OPS or node.name in leave or not deferrable(node.name):
            continue
        checks = _checks_upstream(node, by_name, deferred)
        scope = node.name + "/tfamp_checked/"
        keeping = keeping_write(node, by_name, scope) if checks else None
        if keeping is None:
            continue
        slot, dtype, added = keeping
        added.extend(_all_passed(checks, scope))
        write_selected(graph_def, node, (slot, dtype, added), scope, scope + "passed", "checked_only")
        held.append(node.name)
    return held


def hold_checked_steps(graph_def, deferred: Collection[str], predicates: Collection[str]) -> List[str]:
    """Makes, in place, each TF1 cond of ``graph_def`` on one of ``predicates`` (the node
    names of loss-scaled steps' apply predicates) that is computed from ``deferred`` checks
    -- an exploding-gradient guard under ``control_dependencies`` before ``apply_gradients``
    -- apply only where they all passed: a failing check stopped the run before the update
    in float32.  The cond's own ``Switch(pred, pred)`` and ``pred_id`` read
    ``LogicalAnd(pred, passed)`` instead (the finite flag the session fetches, and the loss
    scale's update, are left as they are); returns the Switches' names."""
    by_name = {node.name: node for node in graph_def.node}
    deferred, held = set(deferred), []
    for node in list(graph_def.node):
        if node.op != "Switch" or len(node.input) < 2 or node.input[0] != node.input[1]:
            continue
        predicate = node.input[0]
        checks = _checks_upstream(node, by_name, deferred) if parse_input(predicate)[0] in predicates else []
        if not checks:
            continue
        scope = node.name + "/tfamp_checked/"
        added = _all_passed(checks, scope)
        added.append(node_def(scope + "predicate", "LogicalAnd", [predicate, scope + "passed"]))
        for each in added:
            each.device = node.device
        graph_def.node.extend(added)
        node.input[0] = node.input[1] = scope + "predicate"
        pred_id = by_name.get(node.name.rsplit("/", 1)[0] + "/pred_id")
        if pred_id is not None and pred_id.op == "Identity" and pred_id.input[0] == predicate:
            pred_id.input[0] = scope + "predicate"
        held.append(node.name)
    return held


def _all_passed(checks: List[str], scope: str) -> List:
    """The nodes computing ``scope + "passed"``: whether none of ``checks`` saw inf/nan."""
    added, passed = [], []
    for check in checks:
        passed.append(scope + "passed_%d" % len(passed))
        added.append(node_def(passed[-1] + "/failed", "Any", [check + STATUS, check + SCOPE + "zero"],
                              Tidx=types_pb2.DT_INT32))
        added.append(node_def(passed[-1], "LogicalNot", [passed[-1] + "/failed"]))
    added.append(node_def(scope + "every", "Pack", passed, ints={"N": len(passed)}, T=types_pb2.DT_BOOL))
    added.append(node_def(scope + "passed", "All", [scope + "every", checks[0] + SCOPE + "zero"],
                          Tidx=types_pb2.DT_INT32))
    return added


def _checks_upstream(node, by_name, checks: Set[str]) -> List[str]:
    """The ``checks`` ``node`` is computed from, through data or control inputs, sorted."""
    found, stack, seen = set(), [parse_input(text)[0] for text in node.input], set()
    while stack:
        name = stack.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        if name in checks:
            found.add(name)
        stack.extend(parse_input(text)[0] for text in by_name[name].input)
    return sorted(found)

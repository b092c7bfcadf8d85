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
fetch.  The session judges the statuses after each run (deferred_checks.py).  The user's
graph is not changed.
"""
from __future__ import annotations

from typing import Callable, List

from tensorflow.core.framework import types_pb2

from .node_defs import flattened, node_def

_CHECK_OP = "CheckNumerics"
_SCOPE = "/tfamp_check/"
STATUS = _SCOPE + "status"  # a check's status node: its name + STATUS


def defer_checks(graph_def, deferrable: Callable[[str], bool]) -> List[str]:
    """Turns, in place, each ``CheckNumerics`` of ``graph_def`` that ``deferrable(name)``
    accepts into an ``Identity`` with a status beside it (module docstring); returns their
    names."""
    deferred = []
    for node in list(graph_def.node):
        if node.op != _CHECK_OP or not deferrable(node.name):
            continue
        values, dtype, scope = node.input[0], node.attr["T"].type, node.name + _SCOPE
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

"""What each loss-scaled training step tells: the scale it used and whether it was applied.

``LossScaleOptimizer.apply_gradients`` registers one ``StepSignal`` per train op it builds,
keyed by the graph (weakly: the registry never keeps a graph alive).  Sessions fetch the two
tensors alongside every run that computes them anyway -- the step's own finite flag and its
loss scale as read before the step's update -- so watching the steps costs two scalars per
step and no extra computation (``skip_guard``).
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import List

_registry: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@dataclass(frozen=True)
class StepSignal:
    """One train op's finite flag and the loss scale its step used (tensors of the user graph)."""

    all_finite: object      # bool scalar tensor
    scale: object           # float32 scalar tensor, read before the step updates the scale
    loss_scale: object      # the LossScale (its initial value, minimum, multiplier)
    should_apply: object = None  # the skip cond's predicate (a bool tensor), or None (fixed scale)


def register(graph, signal: StepSignal) -> None:
    with _lock:
        _registry.setdefault(graph, []).append(signal)


def step_signals(graph) -> List[StepSignal]:
    """The StepSignals of ``graph``'s loss-scaled train ops, in the order they were built."""
    with _lock:
        return list(_registry.get(graph, ()))


def in_skip_cond(op) -> bool:
    """True if ``op`` was built inside a TF1 cond that skips a loss-scaled step of its graph
    (a cond_v2 builds its branches in functions, outside the graph's operations)."""
    predicates = {s.should_apply.name for s in step_signals(op.graph) if s.should_apply is not None}
    context = op._get_control_flow_context()  # pylint: disable=protected-access
    while context is not None:
        pred = getattr(context, "pred", None)  # TF1's cond holds Identity(pred), "cond/pred_id"
        if pred is not None and (pred.name in predicates or (
                pred.op.type == "Identity" and pred.op.inputs[0].name in predicates)):
            return True
        context = context.outer_context
    return False

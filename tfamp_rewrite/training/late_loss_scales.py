"""Loss scales that a program's own initialization never saw.

EWC's reference code builds a new ``GradientDescentOptimizer`` for each task's objective
after ``global_variables_initializer`` ran: in float32 it needs no initializer, as the
optimizer has no slots.  Under automatic loss scaling that optimizer gains a loss scale
whose variables nothing initializes, and its first step failed on an uninitialized
``loss_scale_1/current_loss_scale``.

``LateLossScales.after_sync`` looks, after the session's private graph took in what the
user graph gained, at the loss scales of the training steps built since the session's
first run, and initializes those of their variables no run initialized -- said once.  A
step built before the first run is left to the program's initialization, as in float32; a
program that initializes the new variables itself (Adam's slots need it) initializes
them again to the same values.
"""
from __future__ import annotations

from typing import Callable, List

from tensorflow.python.framework import dtypes
from tensorflow.python.ops import gen_resource_variable_ops, gen_state_ops

from .devices import log_once
from .step_signals import loss_scale_variables, step_signals


class LateLossScales:
    """One session's watch over loss scales made after its first run (module docstring)."""

    def __init__(self, user_graph, shadow):
        self.user_graph = user_graph
        self.shadow = shadow
        self._known = 0  # how many of the user graph's step signals this watch looked at
        self._ran = False

    def ran(self) -> None:
        """Records that the session completed a run: the steps built from now on are late."""
        if not self._ran:
            self._ran = True
            self._known = len(step_signals(self.user_graph))

    def after_sync(self, run_private: Callable[[List], list]) -> None:
        """Initializes the uninitialized loss-scale variables of the steps built since the
        first run (``run_private`` runs private-graph fetches), said once."""
        if not self._ran:
            return
        signals = step_signals(self.user_graph)
        if len(signals) == self._known:
            return
        late, self._known = signals[self._known:], len(signals)
        with self.user_graph.as_default():
            variables = loss_scale_variables(late)
        if not variables:
            return
        with self.shadow.graph.as_default():
            initialized = run_private([_is_initialized(self.shadow.private_fetch(v.op).outputs[0])
                                       for v in variables])
        uninitialized = [v for v, done in zip(variables, initialized) if not done]
        if not uninitialized:
            return
        run_private([self.shadow.private_fetch(v.initializer) for v in uninitialized])
        log_once("tfamp_rewrite: the session initialized the loss scale of a training step built "
                 "after its first run ('%s'): the program initialized its variables before that "
                 "optimizer existed, and a float32 optimizer without slots (GradientDescent) needs "
                 "no initializer (said once)" % uninitialized[0].op.name)


def _is_initialized(variable):
    """A bool tensor: whether ``variable`` (a resource handle or a reference) holds a value."""
    if variable.dtype == dtypes.resource:
        return gen_resource_variable_ops.var_is_initialized_op(variable)
    return gen_state_ops.is_variable_initialized(variable)

"""Loss scales that a program's own initialization never saw.

EWC's reference code builds a new ``GradientDescentOptimizer`` for each task's objective
after ``global_variables_initializer`` ran: in float32 it needs no initializer, as the
optimizer has no slots.  Under automatic loss scaling that optimizer gains a loss scale
whose variables nothing initializes, and its first step failed on an uninitialized
``loss_scale_1/current_loss_scale``.

``LateLossScales.before_run`` looks, before a run, at the loss scales of the training steps
built since the session's first run, and initializes those of their variables no run
initialized -- said once.  A step built before the first run is left to the program's
initialization, as in float32, and so is one whose variables the run about to happen
initializes (a program running ``variables_initializer`` of what it added: Adam's slots
need it).

``after_restore`` does the same, after a Saver's restore, for every loss scale the restore
left uninitialized: a Saver given the trainable variables and ``global_step`` (a restarted
``MonitoredTrainingSession`` job's) restores the model in float32, and the session manager
then found the loss scale uninitialized and refused the session.
"""
from __future__ import annotations

from typing import Callable, List

import tensorflow as tf

from .devices import log_once
from .op_walks import ancestors
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

    def _initialized(self, variable, run_private) -> bool:
        """Whether the user graph's ``variable`` holds a value in the session (read once)."""
        try:
            run_private([self.shadow.private_fetch(variable)])
        except tf.errors.FailedPreconditionError:
            return False
        return True

    def _initialize_uninitialized(self, variables, run_private) -> list:
        """Initializes those of the user graph's ``variables`` the session holds no value of;
        returns them."""
        uninitialized = [v for v in variables if not self._initialized(v, run_private)]
        if uninitialized:
            run_private([self.shadow.private_fetch(v.initializer) for v in uninitialized])
        return uninitialized

    def before_run(self, elements, run_private: Callable[[List], list]) -> None:
        """Before a run of ``elements`` (private graph): initializes the uninitialized
        loss-scale variables of the steps built since the first run (``run_private`` runs
        private-graph fetches), said once -- unless this run initializes them itself (a
        program running ``variables_initializer`` of what it added: Adam's slots need it)."""
        if not self._ran:
            return
        signals = step_signals(self.user_graph)
        if len(signals) == self._known:
            return
        late, self._known = signals[self._known:], len(signals)
        with self.user_graph.as_default():
            variables = loss_scale_variables(late)
        computed = ancestors(elements)
        variables = [v for v in variables if self.shadow.private_fetch(v.initializer) not in computed]
        if not variables:
            return
        uninitialized = self._initialize_uninitialized(variables, run_private)
        if not uninitialized:
            return
        log_once("tfamp_rewrite: the session initialized the loss scale ('%s') of a training step "
                 "built after its first run, which no initializer of the program's covered: the "
                 "program's initializers ran before that step existed, or initialized only the "
                 "variables it knew of (said once)" % uninitialized[0].op.name)

    def after_restore(self, run_private: Callable[[List], list]) -> None:
        """After a Saver's restore run: initializes the loss-scale variables it left
        uninitialized (its var_list left them out), said once."""
        with self.user_graph.as_default():
            variables = loss_scale_variables(step_signals(self.user_graph))
        uninitialized = self._initialize_uninitialized(variables, run_private)
        if not uninitialized:
            return
        log_once("tfamp_rewrite: a checkpoint restore left the loss scale ('%s') uninitialized, as "
                 "the Saver's var_list leaves it out: the session initialized it, so the scale "
                 "starts from its initial value (said once)" % uninitialized[0].op.name)

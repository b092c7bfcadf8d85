"""Loss-scaled steps inside a TF1 while loop: training that no longer applies a step.

A step inside ``tf.while_loop`` (TPU-style ``iterations_per_loop``) has a finite flag the
session cannot fetch (step_watch.py says so once), so its skipped steps are not diagnosed or
healed.  When a half value of the forward pass overflows, every step skips: the loss scale
falls to its minimum within a run or two and stays there, and training is frozen, with the
loss NaN and ``global_step`` still.

``LoopSteps.before_run`` reads, before each of the first ``CHECK_EVERY`` runs of such steps
and every ``CHECK_EVERY``-th run then, each one's loss scale and count of applied steps in a
row (the state the previous runs left, read in a run of its own: each run of a loop holds
many steps); when ``FROZEN_CHECKS`` reads in a row find every scale at its minimum with no
step applied, it says once that training in the loop looks frozen, and what to do.
"""
from __future__ import annotations

import re
from typing import Callable, List

from .devices import log_once, nodes_to_exclude_setting

CHECK_EVERY = 10   # runs of loop steps read at first, then between two reads
FROZEN_CHECKS = 3  # reads in a row at the minimum scale, no step applied: frozen
_LOOP_SCOPE = re.compile(r"^(.*?\bwhile(?:_\d+)?)/")


class LoopSteps:
    """One session's reads of its while-loop steps' loss scales (module docstring)."""

    def __init__(self, shadow):
        self.shadow = shadow
        self._runs = 0
        self._frozen_reads = 0
        self._said = False

    def before_run(self, signals: List, run_private: Callable[[List], list]) -> None:
        """Counts a run of the loop steps ``signals``; on the first ``CHECK_EVERY`` and every
        ``CHECK_EVERY``-th then, reads their loss scales' state (``run_private`` runs
        private-graph fetches)."""
        self._runs += 1
        if self._said or (self._runs > CHECK_EVERY and self._runs % CHECK_EVERY):
            return
        states = [self._state(signal) for signal in signals]
        if not all(states):
            return
        values = run_private([self.shadow.private_fetch(v) for state in states for v in state])
        frozen = all(scale <= signal.loss_scale.min_loss_scale and good == 0
                     for signal, (scale, good) in zip(signals, zip(values[::2], values[1::2])))
        self._frozen_reads = self._frozen_reads + 1 if frozen else 0
        if self._frozen_reads >= FROZEN_CHECKS:
            self._said = True
            self._say_frozen(signals[0])

    def _state(self, signal):
        """``(scale variable, applied-in-a-row variable)`` of a dynamic loss scale, or None."""
        with self.shadow.user_graph.as_default():
            variables = signal.loss_scale.variables()
        named = {v.op.name.rsplit("/", 1)[-1]: v for v in variables}
        if "current_loss_scale" not in named or "good_steps" not in named:
            return None
        return named["current_loss_scale"], named["good_steps"]

    def _say_frozen(self, signal) -> None:
        scope = _LOOP_SCOPE.match(signal.all_finite.name)
        loop = scope.group(1) if scope else "while"
        log_once(
            "tfamp_rewrite: training inside the TF1 tf.while_loop %r looks frozen: before each of "
            "the last %d runs read, its loss scale was at its minimum (%g) and no step had applied since, "
            "so its gradients hold inf/nan at any scale -- a %s value of the forward pass that "
            "overflows, or an inf/nan of float32's own. The session cannot look into the loop or "
            "heal it: keep the loop's nodes float32 with %s, or call apply_gradients outside the "
            "loop to have its steps watched and healed (said once)" % (
                loop, FROZEN_CHECKS, signal.loss_scale.min_loss_scale, self.shadow.dtype,
                nodes_to_exclude_setting(["^%s/" % re.escape(loop)])))

"""The session's side of ``check_numerics`` and assertions that wait for the loss scaling.

In a graph with a loss-scaled step, the copy a rewriting session imports runs each
``CheckNumerics`` as an ``Identity`` with a status beside it (check_deferral.py), and each
assertion on floating-point values as a ``StringFormat`` of its data with a status and a
message (assertion_deferral.py).  ``DeferredChecks`` fetches the statuses of the checks a
run computes, packed into one tensor, and the assertions' messages, packed into another
(``fetches(elements, fed)``), and judges them after the run (``after_run``)::

    none inf/nan:                               nothing to do
    the run skipped its loss-scaled step while the session can still act on it
      (step_watch.skipped_while_recovering_since): no weight was updated; said once
    otherwise:                                  raises the InvalidArgumentError TensorFlow's
                                                kernel raises ("... : Tensor had NaN values",
                                                "assertion failed: [...]"), naming the user's
                                                node and where it was made (the first made)

Partial runs cannot fetch the statuses: a partial run that computes a deferred check says
once that it is not evaluated there.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from .assertion_deferral import ASSERT_OP, MESSAGE, failure_message, shows_floats, shows_non_finite
from .check_deferral import STATUS
from .devices import log_once
from .op_walks import ancestors
from .user_errors import raised_at


class DeferredChecks:
    """A rewriting session's deferred checks (module docstring)."""

    def __init__(self, shadow):
        self.shadow = shadow
        self._key = None
        self._computed: Dict[tuple, Optional[Tuple[List[str], object]]] = {}

    def fetches(self, elements: Sequence, fed=()) -> Optional[Tuple[List[str], List[object]]]:
        """``(check names, [packed statuses] + [packed messages, if any is an assertion])``
        for a run of ``elements`` (private graph), or None when it computes no deferred
        check."""
        checks = self.shadow.deferred_checks
        if not checks:
            return None
        key = (self.shadow.private_name(""), len(checks))
        if key != self._key:
            self._key = key
            self._computed.clear()
        run = (tuple(getattr(e, "name", str(e)) for e in elements), tuple(sorted(t.name for t in fed)))
        with self.shadow.lock:  # it adds ops to the private graph (run_plans.RunPlans.get)
            if run not in self._computed:
                self._computed[run] = self._plan(elements, fed, sorted(checks))
            return self._computed[run]

    def _plan(self, elements, fed, checks):
        private = self.shadow.graph
        computed = ancestors(elements, {t.name for t in fed})
        names = [n for n in checks if private.get_operation_by_name(self.shadow.private_name(n)) in computed]
        if not names:
            return None
        tensor = lambda name: private.get_tensor_by_name(self.shadow.private_name(name) + ":0")  # noqa: E731
        asserted = [n for n in names if self._is_assertion(n)]
        with private.as_default():
            packed = [tf.stack([tensor(n + STATUS) for n in names], name="tfamp_deferred_checks")]
            if asserted:
                packed.append(tf.stack([tensor(n + MESSAGE) for n in asserted],
                                       name="tfamp_deferred_assertions"))
        return names, packed

    def _is_assertion(self, name: str) -> bool:
        return self.shadow.user_graph.get_operation_by_name(name).type == ASSERT_OP

    def after_run(self, names: List[str], values: Sequence, skipped_while_recovering: bool) -> None:
        """Raises TensorFlow's error for the first check that saw inf/nan or assertion that
        failed (``values``: what ``fetches`` planned, fetched), unless the run's loss-scaled
        step was skipped while the session can still act on it."""
        failing = [(name, nan, inf) for name, (nan, inf) in zip(names, np.asarray(values[0])) if nan or inf]
        if not failing:
            return
        user_graph = self.shadow.user_graph
        # the first check the program made: tf.add_check_numerics_ops chains them in that
        # order, and an upstream check is made before those computed from its value
        name, nan, inf = min(failing, key=lambda f: user_graph.get_operation_by_name(f[0])._id)
        op = user_graph.get_operation_by_name(name)
        if op.type == ASSERT_OP:
            asserted = [n for n in names if self._is_assertion(n)]
            message = failure_message(np.asarray(values[1])[asserted.index(name)])
            if shows_floats(op) and not shows_non_finite(message):
                skipped_while_recovering = False  # finite values alone: no skipped step's doing
        else:
            kind = "Inf and NaN" if nan and inf else "Inf" if inf else "NaN"
            message = "%s : Tensor had %s values" % (op.get_attr("message").decode(), kind)
        if skipped_while_recovering:
            what = ("an assertion ('%s') failed" % name if op.type == ASSERT_OP
                    else "a check_numerics saw inf/nan")
            log_once("tfamp_rewrite: %s in a step the loss scaling skipped, so its optimizer "
                     "applied no update (and writes computed from it none); the checks wait "
                     "while the session finds the cause, and fail the run as TensorFlow's do "
                     "once the session cannot act (said once)" % what, key="a check failed in a skipped step")
            return
        raise raised_at(tf.errors.InvalidArgumentError, op, message)

    def say_unchecked_in_partial_runs(self, elements, fed=()) -> None:
        """Says once that the deferred checks a partial run computes are not evaluated."""
        planned = self.fetches(elements, fed)
        if planned is not None:
            names = planned[0]
            shown = ", ".join(repr(n) for n in names[:3])
            if len(names) > 3:
                shown += " and %d more" % (len(names) - 3)
            one = len(names) == 1
            log_once("tfamp_rewrite: check_numerics %s %s not evaluated in partial runs of a "
                     "rewriting session (%s cannot be fetched there)"
                     % (shown, "is" if one else "are", "its status" if one else "their statuses"))

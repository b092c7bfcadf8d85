"""Saying so, once per session, when a run no step watch covers meets inf/nan.

A run that computes no loss-scaled step (inference, evaluation, a served model, an L-BFGS
loop fetching a loss and its ``tf.gradients``) has no step watch: a skipped step cannot be
told from an inference, and an inference cannot be run again safely (input pipelines,
``py_func``).  ``InferenceWatch`` says, once per session, the first such run that

    returned inf/nan in a fetched floating value                    (after_run)
    computed inf/nan that its fetched values hide: an argmax,       (hidden_fetches, then
      comparison, CTC decoder or integer cast read it               after_run)
    failed an assertion below a half node (a metric's range check)  (after_failure)

naming what it can, with what float16 may have done and how to keep the node float32.
The hidden inf/nan check (hidden_non_finite.py) costs a few ops and a fetch, so it runs on
each of a session's first ``CHECK_EVERY_RUN`` inference runs, then on one in ``CHECK_THEN``;
among the first, each kind of run (its fetches and feeds) skips it on its second run, so
that TensorFlow prepares the run without the checks at start-up, not as a pause of seconds
in the middle of training (a graph holding its dataset as a constant is prepared anew).

Once that is said, ``OriginSearch`` (origin_search.py) looks for where it starts on the
next runs that compute it, says where with the edit that keeps it float32, and returns
what to keep for the session to heal.

A training run whose loss-scaled steps all applied, yet returned inf/nan (``after_step_run``:
a loss behind ``tf.maximum`` of an overflow, whose gradients are zero) or computed inf/nan
that its forward pass hides (``step_run_fetches``: ``1 - ssim`` of 0..255 images is 1, its
gradients zero), is said once too, and its origin looked for the same way.
"""
from __future__ import annotations

import math
import re
from typing import List, Optional, Tuple

import numpy as np

from .absolute_precision import INDICES_INPUT
from .assertion_deferral import values_upstream
from .decompositions import DECOMPOSITIONS, nearest_half_producers
from .devices import log_once, nodes_to_exclude_setting
from .gradient_accumulation import gradient_accumulation_writes
from .half_writes import PASS_THROUGH
from .hidden_non_finite import HiddenNonFinite
from .loss_scale_optimizer import LOSS_SCALE_COLLECTION
from .non_finite_origin import HALF, Origin
from .op_walks import ancestors
from .origin_search import OriginSearch
from .python_backprop import PYTHON_OPS
from .run_plans import ORIGIN, RunPlans, run_key
from .shadow_graph import has_operation
from .state_guard import WRITE_OPS
from .step_watch import AUTO_FIX_ENV

CHECK_EVERY_RUN = 64  # inference runs checked for hidden inf/nan, then
CHECK_THEN = 16       # one such run in this many
UNCHECKED_EARLY = 2   # ... and each kind of run's second run is not checked (module docstring)
# TensorFlow's own lookup of a failing node (Session._do_call) matches the first "[[" of the
# message, which may be a printed value ("[[-nan]..."): the name is read from its tag.
_FAILED_NODE = re.compile(r"\{\{node ([^}\s]+)\}\}")
_MOST_REGION_NODES = 32  # of the half region a failed gather's indices or decomposition come from
_OUT_OF_BOUNDS = re.compile(r"is not in \[|does not index into|out of range|out of bounds")
_ACCUMULATOR_PUSHES = {"AccumulatorApplyGradient", "ResourceAccumulatorApplyGradient",
                       "SparseAccumulatorApplyGradient"}


class InferenceWatch:
    """One rewriting session's notices about inf/nan in runs with no loss-scaled step."""

    def __init__(self, shadow, heals: bool = True):
        self.shadow = shadow
        self.heals = heals  # whether the session keeps float32 what the origin search finds
        self.said = False
        self._hidden = HiddenNonFinite(shadow)
        self._hidden_in_steps = HiddenNonFinite(shadow, forward_only=True)
        self.search = OriginSearch(shadow)
        self._micro_batches = RunPlans(shadow, self._adds_scaled_gradients)
        self._said_applied = False  # a training run's inf/nan with finite gradients: said once
        self._runs = 0             # inference runs, and training runs, counted for check_due
        self._step_runs = 0
        self._runs_of_kind = {}    # (fetches, feeds) -> its runs, among the first CHECK_EVERY_RUN
        self._not_float16 = set()  # user nodes whose inf/nan a search found to start elsewhere
        self._half_upstream = {}   # (generation, fetch name) -> whether a half node computes it

    def hidden_fetches(self, elements, fed=()):
        """What this inference run fetches besides, for ``after_run``: while an origin is
        looked for, ``OriginSearch.plan``; before anything is said, ``HiddenNonFinite.fetches``
        (or None when it does not check, ``check_due``)."""
        if self.looking_for_origin():
            return self.search.plan(elements, fed)
        if self.said:
            return None
        return self._hidden.fetches(elements, fed) if self.check_due(run_key(elements, fed)) else None

    def adds_scaled_gradients(self, elements, fed=()) -> bool:
        """Whether a run of ``elements`` (fed ``fed``) adds loss-scaled gradients into an
        accumulator that a step applies in a run of its own (``gradient_accumulators``, or a
        ConditionalAccumulator of SyncReplicasOptimizer's): its inf/nan is the loss scale's,
        which that step's finite check sees and skips.  Such a run is not watched as an
        inference."""
        return self._micro_batches.get(elements, fed)

    def _adds_scaled_gradients(self, elements, fed) -> bool:
        writes = gradient_accumulation_writes(self.shadow.user_graph)
        computed = ancestors(elements, {t.name for t in fed})
        # a SyncReplicasOptimizer worker's run pushes its gradients into the chief's
        # accumulators, whose loss-scaled step applies them in a run of its own
        return any(op.type in _ACCUMULATOR_PUSHES or self.shadow.user_name(op.name) in writes
                   for op in computed)

    def looking_for_origin(self) -> bool:
        """Whether the origin of what was said is being looked for (``OriginSearch.active``)."""
        return self.search.active()

    def traces(self, fetches, values) -> bool:
        """Whether an inf/nan these ``values`` (of the user's ``fetches``) hold is being traced
        to its node: a search is on."""
        return self.search.active() and _non_finite_leaf(fetches, values) is not None

    def hidden_plan(self, elements, fed=()):
        """``HiddenNonFinite.fetches`` whatever ``check_due`` says (a callable's, fixed when
        it is made), or None once something has been said."""
        return None if self.said else self._hidden.fetches(elements, fed)

    def check_due(self, kind=None) -> bool:
        """Whether this inference run checks for hidden inf/nan (counts it); ``kind``: what
        tells its kind of run apart (any key; None: not told)."""
        if self.said:
            return False
        self._runs += 1
        return self._due(self._runs, kind)

    def _due(self, count: int, kind) -> bool:
        if kind is not None and count <= CHECK_EVERY_RUN:
            runs = self._runs_of_kind[kind] = self._runs_of_kind.get(kind, 0) + 1
            if runs == UNCHECKED_EARLY:
                return False
        return _due(count)

    def step_run_fetches(self, elements, fed=()):
        """What a training run fetches besides, for ``after_step_run``: while an origin is
        looked for, its forward pass's origin statuses (not its gradients': their inf/nan
        is the loss scale's); before a training run's inf/nan was said, on the runs
        ``step_check_due`` picks, the checks of what its forward pass hides -- also while a
        search waits for a run computing another node (an evaluation's metric said before
        training began): the training runs' own inf/nan is not left unwatched meanwhile."""
        if self.looking_for_origin():
            plan = self.search.plan(elements, fed, training=True)
            if plan is not None:
                return plan
        plan = self.step_hidden_plan(elements, fed)
        return plan if plan is not None and self.step_check_due(run_key(elements, fed)) else None

    def step_hidden_plan(self, elements, fed=()):
        """The checks of what a training run's forward pass hides (a callable's, fixed when
        it is made), or None once a training run's inf/nan was said."""
        return None if self._said_applied else self._hidden_in_steps.fetches(elements, fed)

    def step_check_due(self, kind=None) -> bool:
        """Whether this training run checks for hidden inf/nan (counts it): as inference
        runs are picked (``check_due``), counted apart."""
        if self._said_applied:
            return False
        self._step_runs += 1
        return self._due(self._step_runs, ("step", kind) if kind is not None else None)

    def after_run(self, fetches, values, hidden=None, hidden_statuses=None
                  ) -> Optional[Tuple[Origin, List[str]]]:
        """Says the first inf/nan in ``values`` (the user's ``fetches``), else the first
        tensor ``hidden`` (what ``hidden_fetches`` planned) found holding one; returns the
        origin an origin search found, for the session to heal."""
        if hidden is not None and hidden.kind == ORIGIN:
            found = self.search.after_run(hidden, hidden_statuses,
                                          _non_finite_leaf(fetches, values) is not None)
            if self.search.ended_without_origin and not self.search.kept_for_good:
                # watch again, but not that node
                self.search.ended_without_origin, self.said = False, False
                self._not_float16.add(self.search.said_node)
            return found
        if self.said:
            if self.search.waits_after_heal():
                self.search.again_if_non_finite(_non_finite_leaf(fetches, values))
            elif self.search.active():  # a run with no half region to look at
                self.search.returned_from_state(_non_finite_leaf(fetches, values))
            return None
        found = _non_finite_leaf(fetches, values)
        entry = self._first_hidden(hidden, hidden_statuses) if found is None else None
        if found is not None and not self._float16_may_cause(found):
            return None
        if found is not None and self._computed_at_the_loss_scale(found):
            return None
        if entry is not None and self._computed_at_the_loss_scale(getattr(entry, "tensor", None)):
            return None  # a gradient histogram's filter, in a summary thread's run
        if found is not None:
            name = getattr(found, "name", found)
            self._say("returned inf/nan%s and computed no loss-scaled step the session watches, so "
                      "nothing skipped or healed it"
                      % (" in %r" % name if isinstance(name, str) and name else ""), found)
        elif entry is not None:
            wrong = ("" if getattr(entry, "reader_op", None) in WRITE_OPS else
                     " -- they are finite and wrong (an argmax, a top_k or a comparison over "
                     "inf/nan picks arbitrary entries, a division by inf gives 0) --")
            self._say("computed inf/nan in %s, so the values it returned do not show it%s and "
                      "computed no loss-scaled step the session watches, so nothing skipped or "
                      "healed it" % (entry, wrong or ","), entry)
        return None

    def after_failure(self, error, elements, fed=()) -> Optional[Tuple[Origin, List[str]]]:
        """Says a run (of ``elements``, fed ``fed``) that failed an assertion or a matrix
        decomposition below a half node: its values cannot be looked at then.  Where one
        failed again while its origin is looked for (an assertion in a while loop, an
        evaluation graph's range check: every run fails before the search can look),
        returns the half nodes nearest up from it, for the session to heal."""
        message = error.message or ""
        graph = self.shadow.graph
        names = [name for name in _FAILED_NODE.findall(message) if has_operation(graph, name)]
        checked = "assertion failed" in message or (
            names and graph.get_operation_by_name(names[-1]).type == "CheckNumerics")
        if self.said:
            failed = graph.get_operation_by_name(names[-1]) if names else None
            if (checked and failed is not None and self.search.active()
                    and any(self.shadow.computes_in_half(op) for op in values_upstream([failed]))):
                return self._failed_again(failed)
            return None
        if names and graph.get_operation_by_name(names[-1]).type in DECOMPOSITIONS:
            self._say_decomposition_failed(graph.get_operation_by_name(names[-1]))
            return None
        if names and graph.get_operation_by_name(names[-1]).type in PYTHON_OPS:
            self._say_python_failed(graph.get_operation_by_name(names[-1]))
            return None
        if (names and graph.get_operation_by_name(names[-1]).type in INDICES_INPUT
                and _OUT_OF_BOUNDS.search(message)):
            self._say_indexing_failed(graph.get_operation_by_name(names[-1]))
            return None
        if not checked:
            return None
        if names:
            upstream = values_upstream([graph.get_operation_by_name(names[-1])])
            which = "the %s %r" % ("assertion" if "assertion failed" in message else "check_numerics",
                                   self.shadow.user_name(names[-1]))
        else:  # an Assert in a control flow v2 branch is named as in the branch's function
            upstream = ancestors(elements, {t.name for t in fed})
            which = "an assertion (%s)" % message[message.index("assertion failed"):].split("\n")[0][:80]
        if any(self.shadow.computes_in_half(op) for op in upstream):
            self._say("failed in %s, which %s nodes lie upstream of (a metric's range check fails "
                      "on NaN predictions)" % (which, self.shadow.dtype), then="If float32 passes it",
                      rounded=True)
        return None

    def _failed_again(self, failed) -> Optional[Tuple[Origin, List[str]]]:
        """The origin to heal for an assertion or check (private op ``failed``) that failed a run again
        while its origin was looked for: the half nodes nearest up from it, said once."""
        half = self._nearest_half_producers(failed)
        self.search.failed_again(healing=bool(half) and self.heals)
        if not half:
            return None
        which = self.shadow.user_name(failed.name)
        log_once("tfamp_rewrite: the check %r failed a run again before its values could be "
                 "looked at, so the search cannot look past it: the %s nodes nearest up from it "
                 "(%s) are to keep float32, with %s (said once)" % (
                     which, self.shadow.dtype, ", ".join(repr(name) for name in half[:4])
                     + (", ..." if len(half) > 4 else ""),
                     nodes_to_exclude_setting(["^%s$" % re.escape(name) for name in half])))
        return Origin(tensor=which, kind=HALF, node=half[0], op=failed.type), half

    def _nearest_half_producers(self, failed) -> List[str]:
        """User names of the half nodes nearest up from private op ``failed`` that compute
        the values it reads, past those passing values on (a max, a switch, a reshape) and
        casts the rewrite added: keeping them float32 keeps what passes them on float32."""
        return sorted({self.shadow.user_name(op.name)
                       for op in nearest_half_producers(failed, self.shadow.computes_in_half, self._passes)})

    def _passes(self, op) -> bool:
        """Whether private ``op`` only passes values on: a max, a switch, a reshape, or a
        cast or rounding the rewrite added."""
        added = not has_operation(self.shadow.user_graph, self.shadow.user_name(op.name))
        return op.type in PASS_THROUGH or added

    def _say_decomposition_failed(self, failed) -> None:
        """Says, once, a matrix decomposition (private op ``failed``) that failed on a matrix
        half nodes computed, naming the half region it came from: the run raised, so no
        later run may come to look for them, and the program may end here."""
        dtype = self.shadow.dtype
        self._say_failed_on_half_values(
            failed, self._half_region_up_from(failed),
            "which decomposes a matrix that %s nodes computed" % dtype,
            "a %s value past %s's range makes it inf/nan, and %s's rounding can leave a "
            "covariance or kernel matrix no longer positive definite" % (dtype, dtype, dtype))

    def _say_python_failed(self, failed) -> None:
        """Says, once, a ``py_func`` (private op ``failed``) that failed on values half nodes
        computed (sklearn's "Input contains infinity"), naming the nearest of them."""
        self._say_failed_on_half_values(
            failed, self._nearest_half_producers(failed),
            "whose Python code was given values that %s nodes computed" % self.shadow.dtype,
            "a value past %s's range reaches it as inf" % self.shadow.dtype)

    def _say_indexing_failed(self, failed) -> None:
        """Says, once, a gather or scatter (private op ``failed``) given indices out of bounds
        that half nodes computed (a bilinear sampler's pixel coordinates), naming them:
        float16 rounds a clip's bound of W - 1.001 up to W - 1, positions past 2048 to its
        spacing, and a value past its range is inf (INT_MIN once cast)."""
        dtype = self.shadow.dtype
        self._say_failed_on_half_values(
            failed, self._half_region_up_from(failed.inputs[INDICES_INPUT[failed.type]].op),
            "whose indices %s nodes computed" % dtype,
            "%s rounds positions past 2048 to its spacing and a clip's bound (W - 1.001) to W - 1, "
            "and a value past its range is inf, the lowest integer once cast" % dtype)

    def _half_region_up_from(self, op) -> List[str]:
        """User names of the half nodes nearest up from private ``op`` (past float32 and
        integer arithmetic, casts, nodes passing values on) and of the half region they
        extend up: keeping a Floor alone float32 still floors the clip's rounded bound, and
        keeping the last MatMul of a chain (MDS's J @ D2 @ J) leaves the first overflowing."""
        def half(each):
            return self.shadow.computes_in_half(each) and not self._passes(each)

        region, stack = set(), ([op] if half(op) else
                                nearest_half_producers(op, self.shadow.computes_in_half, self._passes))
        while stack and len(region) < _MOST_REGION_NODES:
            each = stack.pop()
            if each not in region and (half(each) or self._passes(each)):
                region.add(each)
                stack.extend(t.op for t in each.inputs)
        return sorted({self.shadow.user_name(each.name) for each in region if half(each)})

    def _say_failed_on_half_values(self, failed, half: List[str], given: str, why: str) -> None:
        """Says, once, that a run failed in private op ``failed``, ``given`` values the user
        nodes ``half`` computed (``why`` they can fail it), with the setting that keeps them."""
        if not half:
            return
        self.said = True
        log_once("tfamp_rewrite: a run of the rewritten graph failed in %r (%s), %s (%s): %s. If "
                 "float32 runs, keep %s float32 with %s (said once)" % (
                     self.shadow.user_name(failed.name), failed.type, given,
                     ", ".join(repr(name) for name in half[:4]) + (", ..." if len(half) > 4 else ""),
                     why, "it" if len(half) == 1 else "them",
                     nodes_to_exclude_setting(["^%s$" % re.escape(name) for name in half])))

    def after_step_run(self, fetches, values, applied: bool, plan=None, statuses=None
                       ) -> Optional[Tuple[Origin, List[str]]]:
        """After a run that computed a loss-scaled step (``applied``: every one applied): the
        origin its ``plan`` (``step_run_fetches``) found, for the session to heal; else, the
        first time such a run returns inf/nan, or its forward pass hides one, though its
        steps applied -- a float16 overflow behind ops that pass no gradient through
        inf/nan leaves the gradients finite, zero, and the weights where they were -- says
        so and looks for the origin."""
        if plan is not None and plan.kind == ORIGIN:
            return self.search.after_run(plan, statuses, _non_finite_leaf(fetches, values) is not None)
        if not applied:
            return None
        if self._said_applied:
            if self.search.waits_after_heal():
                self.search.again_if_non_finite(_non_finite_leaf(fetches, values))
            elif self.search.active():  # a run with no half region to look at
                self.search.returned_from_state(_non_finite_leaf(fetches, values))
            return None
        found = _non_finite_leaf(fetches, values)
        if found is not None:
            name, said = getattr(found, "name", found), found
            what = ("returned inf/nan%s, yet its gradients were finite"
                    % (" in %r" % name if isinstance(name, str) and name else ""))
            behind = ("a loss behind ops that pass no gradient through inf/nan (tf.maximum, a max or "
                      "min reduction, a comparison) leaves the gradients zero and the weights where "
                      "they were.")
            if self._differentiated(found):  # the loss itself: the first clause would not fit
                how = "The step's gradients read it: " + behind
            else:
                how = "A value the loss does not compute is no step's concern; " + behind
        elif plan is not None and statuses is not None and np.any(statuses):
            said = entry = plan.entries[int(np.argmax(statuses))]
            what = ("computed inf/nan in %s, which the values it returned do not show, and its "
                    "gradients were finite" % (entry,))
            how = ("A loss computed through it can look finite while its gradients are zero and "
                   "the weights stay where they were: a ratio whose denominator overflowed is 0 "
                   "(1 - SSIM of 0..255 images is 1).")
        else:
            return None
        self._said_applied = True
        # a search still waiting for an evaluation's node gives way: the training runs'
        # inf/nan is the one that spoils the model (its heal keeps the evaluation's twin too)
        self.search.start(said)
        log_once("tfamp_rewrite: a training run of the rewritten graph %s, so its step applied "
                 "and no skipped step was diagnosed. %s The next runs look for where it starts, "
                 "and %s (said once)" % (what, how, self._then_keep("that node")))
        return None

    def _differentiated(self, fetch) -> bool:
        """Whether a backward pass went through ``fetch``'s op (a loss, the logits): tf.gradients
        names what it builds for op ``X`` ``gradients/X_grad/``.  False when the fetch is not
        known by name."""
        graph = self.shadow.user_graph
        try:
            element = fetch if hasattr(fetch, "graph") else graph.as_graph_element(fetch)
        except (TypeError, ValueError, KeyError):
            return False
        if element.graph is not graph:
            return False
        name = getattr(element, "op", element).name
        scope = re.compile(r"(^|/)gradients(_\d+)?/%s_grad/" % re.escape(name))
        return any(scope.search(op.name) for op in graph.get_operations())

    def _first_hidden(self, hidden, statuses):
        """The first ``Hidden`` entry of plan ``hidden`` holding inf/nan (``statuses``), but
        of a node a search found to start elsewhere; None when there is none."""
        if hidden is None or statuses is None:
            return None
        return next((entry for entry, status in zip(hidden.entries, statuses)
                     if status and entry.tensor.split(":")[0] not in self._not_float16), None)

    def _computed_at_the_loss_scale(self, fetch) -> bool:
        """Whether ``fetch`` is computed from a loss multiplied by a loss scale (gradients
        fetched in a run of no step: a norm printed before training): it says so, once. Only
        a step's run can skip and lower the scale its gradients overflowed at."""
        name = getattr(fetch, "name", fetch)
        graph = self.shadow.user_graph
        scales = {t.op for t in graph.get_collection(LOSS_SCALE_COLLECTION)}
        if not scales or not isinstance(name, str) or ":" not in name:
            return False
        try:
            tensor = graph.get_tensor_by_name(self.shadow.user_name(name))
        except (KeyError, ValueError):
            return False
        if not scales & ancestors([tensor]):
            return False
        log_once("tfamp_rewrite: a run of the rewritten graph returned inf/nan in %r, computed from a "
                 "loss multiplied by the loss scale (gradients, or values computed from them), in "
                 "a run with no training step: at the current scale such gradients overflow %s, and "
                 "only a step's own run can skip and lower the scale. Fetched with the train op, "
                 "or after the first steps, they are what float32 gives (said once)"
                 % (self.shadow.user_name(name), self.shadow.dtype),
                 key="inf/nan at the loss scale in a run with no step")
        return True

    def _float16_may_cause(self, fetch) -> bool:
        """False for a fetch no half node lies upstream of (a PSNR of identical frames is inf
        in float32 as much), or whose inf/nan a search already found to start elsewhere;
        True where that cannot be told (a fetch structure that does not say which)."""
        name = getattr(fetch, "name", fetch)
        if not isinstance(name, str) or not name:
            return True
        if name.split(":")[0] in self._not_float16:
            return False
        key = (self.shadow.generation, name)
        if key not in self._half_upstream:  # a float32 inf/nan may come back every run
            try:
                private = self.shadow.private_fetch(fetch)
            except (TypeError, ValueError, KeyError):
                return True
            self._half_upstream[key] = any(self.shadow.computes_in_half(op) for op in ancestors([private]))
        return self._half_upstream[key]

    def _say(self, what: str, said=None, then: str = "If float32 gives finite values there",
             rounded: bool = False) -> None:
        """Says a run's inf/nan (``what``), once, and starts the search for its origin
        (``said``: the fetch or ``Hidden`` entry holding it, if known).  ``rounded``: a
        failure finite values may explain too (an assertion's tolerance)."""
        self.said = True
        self.search.start(said)
        rounding = (" (or, with every value finite, rounded beyond the assertion's tolerance: "
                    "%s keeps about 3 significant digits, so an assert_near of rtol 1e-5 fails on "
                    "its rounding alone, which no node search finds)" % self.shadow.dtype) if rounded else ""
        log_once("tfamp_rewrite: a run of the rewritten graph %s. %s, a %s value overflowed%s, or "
                 "a large constant became inf in %s (a -1e9 attention mask: 0 x inf is nan); "
                 "the next such runs look for the node (tfamp-rewrite doctor names it too), and "
                 "%s (said once)"
                 % (what, then, self.shadow.dtype, rounding, self.shadow.dtype, self._then_keep("it")))

    def _then_keep(self, node: str) -> str:
        """What follows an origin search's find, for a notice's last clause."""
        if self.heals:
            return "the session keeps %s float32 if %s made it" % (node, self.shadow.dtype)
        return "say the list edit that keeps %s float32 (healing is off: %s=0)" % (node, AUTO_FIX_ENV)


def _due(count: int) -> bool:
    """Whether the ``count``-th run of its kind checks for hidden inf/nan."""
    return count <= CHECK_EVERY_RUN or count % CHECK_THEN == 0


def _non_finite_leaf(fetches, values) -> Optional[object]:
    """The fetch whose value holds inf/nan (None when all are finite; ``""`` when the fetch
    structure does not say which).  Cheap: it runs after every run that infers."""
    if isinstance(values, np.floating):
        return None if math.isfinite(values) else fetches
    if isinstance(values, np.ndarray):
        return fetches if values.dtype.kind == "f" and not np.isfinite(values).all() else None
    if isinstance(values, dict):
        keys = list(values)
        parts = [(fetches.get(k, "") if isinstance(fetches, dict) else "", values[k]) for k in keys]
    elif isinstance(values, (list, tuple)):
        same = isinstance(fetches, (list, tuple)) and len(fetches) == len(values)
        parts = [(fetches[i] if same else "", value) for i, value in enumerate(values)]
    else:
        return None
    for fetch, value in parts:
        found = _non_finite_leaf(fetch, value)
        if found is not None:
            return found
    return None


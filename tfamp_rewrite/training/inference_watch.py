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
each of a session's first ``CHECK_EVERY_RUN`` inference runs, then on one in ``CHECK_THEN``.

Once that is said, the next inference runs (at most ``ORIGIN_RUNS``) each fetch whether
the tensors of their half region hold inf/nan (non_finite_origin.py), and the first run
that shows one says, once more, where it starts and the edit that keeps it float32; the
session heals it, with every other origin independent of it in that run (``after_run``
returns them).  After a heal (``origin_healed``), a run that returns inf/nan again starts
the search again, unsaid: the healed nodes' float32 values may not fit the half nodes that
read them next, and the session's heal limit bounds the rounds.

A training run whose loss-scaled steps all applied, yet returned inf/nan (``after_step_run``:
a loss behind ``tf.maximum`` of an overflow, whose gradients are zero) or computed inf/nan
that its forward pass hides (``step_run_fetches``: ``1 - ssim`` of 0..255 images is 1, its
gradients zero), is said once too, and the next runs look for the origin the same way; the
session heals what they find.  A search that finds nothing in ``ORIGIN_RUNS`` runs says so.
"""
from __future__ import annotations

import math
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..doctor.fixes import fix_for
from ..doctor.probes import HalfNode
from .devices import log_once
from .half_readers import half_readers
from .hidden_non_finite import HiddenNonFinite
from .non_finite_origin import ADDED, FED, NonFiniteOrigin, Origin
from .run_plans import ORIGIN
from .shadow_graph import ancestors, has_operation
from .step_watch import AUTO_FIX_ENV
from .twins import twin_nodes
from .while_loops import while_loops

CHECK_EVERY_RUN = 64  # inference runs checked for hidden inf/nan, then
CHECK_THEN = 16       # one such run in this many
ORIGIN_RUNS = 8       # inference runs that look for the origin, once inf/nan was said
# TensorFlow's own lookup of a failing node (Session._do_call) matches the first "[[" of the
# message, which may be a printed value ("[[-nan]..."): the name is read from its tag.
_FAILED_NODE = re.compile(r"\{\{node ([^}\s]+)\}\}")


class InferenceWatch:
    """One rewriting session's notices about inf/nan in runs with no loss-scaled step."""

    def __init__(self, shadow, heals: bool = True):
        self.shadow = shadow
        self.heals = heals  # whether the session keeps float32 what the origin search finds
        self.said = False
        self._hidden = HiddenNonFinite(shadow)
        self._hidden_in_steps = HiddenNonFinite(shadow, forward_only=True)
        self._origin = NonFiniteOrigin(shadow)
        self._origin_in_steps = NonFiniteOrigin(shadow, forward_only=True)
        self._origin_runs = 0      # runs left to look for the origin of what was said
        self._said_applied = False  # a training run's inf/nan with finite gradients: said once
        self._runs = 0             # inference runs, and training runs, counted for check_due
        self._step_runs = 0
        self._search_again = False  # healed: a run returning inf/nan again restarts the search
        self._said_node: Optional[str] = None  # the user node whose inf/nan was said, if known
        self._computes_said: Dict[tuple, bool] = {}  # (generation, node, run) -> computes it

    def hidden_fetches(self, elements, fed=()):
        """What this inference run fetches besides, for ``after_run``: while an origin is
        looked for, ``origin_fetches``; before anything is said, ``HiddenNonFinite.fetches``
        (or None when it does not check, ``check_due``)."""
        if self.looking_for_origin():
            return self.origin_fetches(elements, fed) if self._computes_said_node(elements, fed) else None
        if self.said:
            return None
        return self._hidden.fetches(elements, fed) if self.check_due() else None

    def looking_for_origin(self) -> bool:
        """Whether runs are to fetch ``origin_fetches``: inf/nan was said, its origin was not,
        and fewer than ``ORIGIN_RUNS`` runs looked."""
        return self._origin_runs > 0

    def origin_fetches(self, elements, fed=()):
        """``NonFiniteOrigin.fetches`` for a run of ``elements`` (a training run's too)."""
        return self._origin.fetches(elements, fed)

    def _computes_said_node(self, elements, fed=()) -> bool:
        """Whether a run of ``elements`` (private graph) computes the node whose inf/nan was
        said (True when that is not known): only such runs look for its origin, and count
        towards the ``ORIGIN_RUNS`` the search lasts -- a training loop that never computes
        a feature extractor fetched once neither finds nor rules out its overflow."""
        if self._said_node is None:
            return True
        names = tuple(getattr(e, "name", str(e)) for e in elements)
        key = (self.shadow.private_name(""), self._said_node, names, tuple(sorted(t.name for t in fed)))
        known = self._computes_said.get(key)
        if known is None:
            private = self.shadow.private_name(self._said_node)
            known = self._computes_said[key] = any(
                op.name == private for op in ancestors(elements, {t.name for t in fed}))
        return known

    def _remember_said(self, found) -> None:
        """The user node behind ``found``: a fetch, a name, or a ``Hidden`` entry."""
        name = getattr(found, "tensor", None) or getattr(found, "name", found)
        self._said_node = name.split(":")[0] if isinstance(name, str) and name else None

    def hidden_plan(self, elements, fed=()):
        """``HiddenNonFinite.fetches`` whatever ``check_due`` says (a callable's, fixed when
        it is made), or None once something has been said."""
        return None if self.said else self._hidden.fetches(elements, fed)

    def check_due(self) -> bool:
        """Whether this inference run checks for hidden inf/nan (counts it)."""
        if self.said:
            return False
        self._runs += 1
        return _due(self._runs)

    def step_run_fetches(self, elements, fed=()):
        """What a training run fetches besides, for ``after_step_run``: while an origin is
        looked for, its forward pass's origin statuses (not its gradients': their inf/nan
        is the loss scale's); before a training run's inf/nan was said, on the runs
        ``step_check_due`` picks, the checks of what its forward pass hides."""
        if self.looking_for_origin():
            if not self._computes_said_node(elements, fed):
                return None
            return self._origin_in_steps.fetches(elements, fed)
        plan = self.step_hidden_plan(elements, fed)
        return plan if plan is not None and self.step_check_due() else None

    def step_hidden_plan(self, elements, fed=()):
        """The checks of what a training run's forward pass hides (a callable's, fixed when
        it is made), or None once a training run's inf/nan was said."""
        return None if self._said_applied else self._hidden_in_steps.fetches(elements, fed)

    def step_check_due(self) -> bool:
        """Whether this training run checks for hidden inf/nan (counts it): as inference
        runs are picked (``check_due``), counted apart."""
        if self._said_applied:
            return False
        self._step_runs += 1
        return _due(self._step_runs)

    def session_closed(self) -> None:
        """Says, once per process, that a session closed while its search was on: an
        evaluation's session (an Estimator's) may end before ``ORIGIN_RUNS`` runs looked."""
        if not self.looking_for_origin():
            return
        looked, self._origin_runs = ORIGIN_RUNS - self._origin_runs, 0  # close() may come twice
        log_once("tfamp_rewrite: a session closed while looking for where the inf/nan said above "
                 "starts: %s, so nothing was found or ruled out. If float32 gives inf/nan there too "
                 "(a 0/0 of the model's own), mixed precision did not cause it; tfamp-rewrite doctor, "
                 "given such an input, names the node (said once)"
                 % ("%d of its later runs looked and none showed it" % looked if looked
                    else "none of its later runs computed that node"))

    def origin_healed(self) -> None:
        """The session healed the origin found: the next run returning inf/nan looks again."""
        self._search_again = True

    def _search_if_still_non_finite(self, fetches, values) -> None:
        """After a heal, a run (inferring or training) that returns inf/nan again starts
        the search again, unsaid."""
        found = _non_finite_leaf(fetches, values) if self._search_again else None
        if found is not None:
            self._search_again = False
            self._origin_runs = ORIGIN_RUNS
            self._remember_said(found)

    def after_run(self, fetches, values, hidden=None, hidden_statuses=None
                  ) -> Optional[Tuple[Origin, List[str]]]:
        """Says the first inf/nan in ``values`` (the user's ``fetches``), else the first
        tensor ``hidden`` (what ``hidden_fetches`` planned) found holding one; returns the
        origin an origin search found, for the session to heal."""
        if hidden is not None and hidden.kind == ORIGIN:
            return self.after_origin_run(hidden, hidden_statuses,
                                         _non_finite_leaf(fetches, values) is not None)
        if self.said:
            self._search_if_still_non_finite(fetches, values)
            return None
        found = _non_finite_leaf(fetches, values)
        if found is not None:
            name = getattr(found, "name", found)
            self._remember_said(found)
            self._say("returned inf/nan%s and computed no loss-scaled step, so nothing watched or "
                      "healed it" % (" in %r" % name if isinstance(name, str) and name else ""))
        elif hidden is not None and hidden_statuses is not None and np.any(hidden_statuses):
            entry = hidden.entries[int(np.argmax(hidden_statuses))]
            self._remember_said(entry)
            self._say("computed inf/nan in %s, so the values it returned do not show it, and "
                      "computed no loss-scaled step, so nothing watched or healed it" % (entry,))
        return None

    def after_failure(self, error, elements, fed=()) -> None:
        """Says a run (of ``elements``, fed ``fed``) that failed an assertion below a half
        node: its values cannot be looked at then."""
        message = error.message or ""
        if self.said or "assertion failed" not in message:
            return
        graph = self.shadow.graph
        names = [name for name in _FAILED_NODE.findall(message) if has_operation(graph, name)]
        if names:
            upstream = ancestors([graph.get_operation_by_name(names[-1])])
            which = "the assertion %r" % self.shadow.user_name(names[-1])
        else:  # an Assert in a control flow v2 branch is named as in the branch's function
            upstream = ancestors(elements, {t.name for t in fed})
            which = "an assertion (%s)" % message[message.index("assertion failed"):].split("\n")[0][:80]
        if any(self.shadow.computes_in_half(op) for op in upstream):
            self._say("failed in %s, which %s nodes lie upstream of (a metric's range check fails "
                      "on NaN predictions)" % (which, self.shadow.dtype), then="If float32 passes it")

    def after_step_run(self, fetches, values, applied: bool, plan=None, statuses=None
                       ) -> Optional[Tuple[Origin, List[str]]]:
        """After a run that computed a loss-scaled step (``applied``: every one applied): the
        origin its ``plan`` (``step_run_fetches``) found, for the session to heal; else, the
        first time such a run returns inf/nan, or its forward pass hides one, though its
        steps applied -- a float16 overflow behind ops that pass no gradient through
        inf/nan leaves the gradients finite, zero, and the weights where they were -- says
        so and looks for the origin."""
        if plan is not None and plan.kind == ORIGIN:
            return self.after_origin_run(plan, statuses, _non_finite_leaf(fetches, values) is not None)
        if not applied:
            return None
        if self._said_applied:
            self._search_if_still_non_finite(fetches, values)
            return None
        found = _non_finite_leaf(fetches, values)
        if found is not None:
            name = getattr(found, "name", found)
            self._remember_said(found)
            what = ("returned inf/nan%s, yet its gradients were finite"
                    % (" in %r" % name if isinstance(name, str) and name else ""))
            how = ("A value the loss does not compute is no step's concern; a loss behind ops that "
                   "pass no gradient through inf/nan (tf.maximum, a max or min reduction, a "
                   "comparison) leaves the gradients zero and the weights where they were.")
        elif plan is not None and statuses is not None and np.any(statuses):
            entry = plan.entries[int(np.argmax(statuses))]
            self._remember_said(entry)
            what = ("computed inf/nan in %s, which the values it returned do not show, and its "
                    "gradients were finite" % (entry,))
            how = ("A loss computed through it can look finite while its gradients are zero and "
                   "the weights stay where they were: a ratio whose denominator overflowed is 0 "
                   "(1 - SSIM of 0..255 images is 1).")
        else:
            return None
        self._said_applied = True
        self._origin_runs = ORIGIN_RUNS
        log_once("tfamp_rewrite: a training run of the rewritten graph %s, so its step applied "
                 "and no skipped step was diagnosed. %s The next runs look for where it starts, "
                 "and %s (said once)" % (what, how, self._then_keep("that node")))
        return None

    def after_origin_run(self, plan, statuses, returned_non_finite: bool
                         ) -> Optional[Tuple[Origin, List[str]]]:
        """Says where the inf/nan starts if this run (fetching ``plan``) shows it, and returns
        that origin and the nodes to keep float32 -- its own and those of every other origin
        independent of it -- when keeping them would avoid it; a run that returned inf/nan
        (``returned_non_finite``) while its half region held none says float16 did not."""
        if statuses is None or self._origin_runs <= 0:
            return None
        origin = NonFiniteOrigin.first(plan.entries, statuses)
        if origin is None and returned_non_finite:
            self._origin_runs = 0
            log_once("tfamp_rewrite: the inf/nan said above does not start in the %s nodes: a later "
                     "run returned inf/nan while none of them, nor any value they read, held any. It "
                     "comes from float32 nodes -- which the %s nodes' rounding may still have led "
                     "there: a variance computed from them that comes out negative, then a sqrt -- "
                     "or from a variable an earlier run made inf/nan (a tf.metrics total that "
                     "summed a skipped step's NaN loss, until its local variables are reset) (said "
                     "once)" % (self.shadow.dtype, self.shadow.dtype))
            return None
        if origin is None:
            self._origin_runs -= 1
            if self._origin_runs == 0:
                log_once("tfamp_rewrite: the search for where the inf/nan said above starts has "
                         "ended: %d later runs found none in the %s nodes nor in the values they "
                         "read. It did not recur (an input out of range once), or it starts in "
                         "float32 nodes; tfamp-rewrite doctor, given such an input, names the node "
                         "(said once)" % (ORIGIN_RUNS, self.shadow.dtype))
            return None
        self._origin_runs = 0
        keep = origin.nodes_to_keep()
        if not keep:
            log_once("tfamp_rewrite: the inf/nan of this session's runs starts outside %s: %s %r "
                     "holds it before any %s node reads it, so mixed precision did not cause it "
                     "(said once)" % (self.shadow.dtype, "the fed value" if origin.kind == FED
                                      else "the float32 value", origin.tensor, self.shadow.dtype))
            return None
        loop = self._loop_left_by(origin)
        if loop is not None:
            frame, keep = loop
            where = ("it starts inside while loop %r, whose values cannot be looked at, and %r "
                     "carries it out: its %d %s node(s) are to keep" % (
                         frame, origin.node, len(keep), self.shadow.dtype))
        elif origin.kind == ADDED and not origin.source_half:
            where = ("the float32 value of %r (%s) does not fit %s where %s read%s it" % (
                origin.node, origin.op, self.shadow.dtype, ", ".join(repr(n) for n in keep[:4]),
                "s" if len(keep) == 1 else ""))
        else:
            where = "%r (%s) is the first %s node computing inf/nan" % (
                origin.node, origin.op, self.shadow.dtype)
        others = [each for each in NonFiniteOrigin.independent(plan.entries, statuses)
                  if each is not origin and each.nodes_to_keep()]
        keep = self._with_half_readers(origin, keep)
        for each in others:
            keep = keep + [name for name in self._with_half_readers(each, each.nodes_to_keep())
                           if name not in keep]
        if others:
            where += ", and %d more start%s on %s own: %s" % (
                len(others), "s" if len(others) == 1 else "", "its" if len(others) == 1 else "their",
                ", ".join("%r (%s)" % (each.node, each.op) for each in others[:4])
                + (", ..." if len(others) > 4 else ""))
        twins = twin_nodes(self.shadow.user_graph, keep, self.shadow.converted_now())
        log_once("tfamp_rewrite: found where the inf/nan starts (a later run of the rewritten "
                 "graph): %s. Keep %s float32 with %s or nodes_to_exclude=%s (said once)" % (
                     where, "them" if len(keep) > 1 else "it", self.list_edit(keep),
                     ["^%s$" % re.escape(name) for name in keep + twins]))
        return origin, keep

    def _loop_left_by(self, origin: Origin) -> Optional[Tuple[str, List[str]]]:
        """(frame, its converted nodes) when ``origin`` is the Exit of a TF1 while loop with
        converted nodes: the inf/nan started inside, where no tensor can be fetched."""
        if origin.op not in ("Exit", "RefExit"):
            return None
        graph_def = self.shadow.user_graph.as_graph_def()
        readers: Dict[str, List[str]] = {}
        for node in graph_def.node:
            for text in node.input:
                if not text.startswith("^"):
                    readers.setdefault(text.split(":")[0], []).append(node.name)
        loop = while_loops(graph_def, readers).get(origin.node)
        converted = self.shadow.converted_now()
        half = [name for name in (loop[1] if loop else ()) if name in converted]
        return (loop[0], half) if half else None

    def _with_half_readers(self, origin: Origin, keep: List[str]) -> List[str]:
        """``keep`` (``origin``'s nodes to keep float32) and the converted nodes its value
        would reach in half once they are float32 (half_readers.py)."""
        decisions = {d.name: d for report in self.shadow.reports for d in report.decisions}
        graph = self.shadow.user_graph

        def readers(name):
            if not has_operation(graph, name):
                return ()
            return [reader.name for output in graph.get_operation_by_name(name).outputs
                    for reader in output.consumers()]

        return half_readers(origin.node, [n for n in keep if n in decisions], decisions, readers) + \
            [n for n in keep if n not in decisions]

    def list_edit(self, names) -> str:
        """The op-list edit (environment variables) that keeps the user's nodes ``names`` float32."""
        decisions = {d.name: d for report in self.shadow.reports for d in report.decisions
                     if d.name in names}
        return fix_for([HalfNode(n, decisions[n].op, decisions[n].category) for n in names]).env

    def _say(self, what: str, then: str = "If float32 gives finite values there") -> None:
        self.said = True
        self._origin_runs = ORIGIN_RUNS
        log_once("tfamp_rewrite: a run of the rewritten graph %s. %s, a %s value overflowed, or "
                 "a large constant became inf in %s (a -1e9 attention mask: 0 x inf is nan); "
                 "the next such runs look for the node (tfamp-rewrite doctor names it too), and "
                 "%s (said once)"
                 % (what, then, self.shadow.dtype, self.shadow.dtype, self._then_keep("it")))

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


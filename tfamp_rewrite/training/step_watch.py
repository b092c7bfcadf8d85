"""A rewriting session's watch over its loss-scaled steps: notice, name, heal.

Every run that computes a loss-scaled step also fetches that step's finite flag and scale
(``step_signals``; two scalars).  Per train op a ``SkipGuard`` decides when a run of skipped
steps deserves a diagnosis; the next such step then also fetches the range probes it
computes anyway (``StepDiagnosis``) -- no extra run, no input consumed.  A diagnosis first
asks whether the model's own weights hold inf/nan (``VariableCheck``): then nothing is
healed, the warning says so (naming a write of a skipped step's gradients where one made
them so), and a ``NanTensorHook`` stops training as TensorFlow's does.  Values the run was
fed inf/nan (a TD target from a target network) are no culprit's: what reads them is a
victim, and without a culprit a warning names them.
Culprits found (every one the probed step shows, none computed from another's inf/nan)::

    warn once per episode: each culprit's node, op and list, and largest |x|; the scale's
        trajectory; the one list edit (and node names) that keep them all float32
    healing on (default; TFAMP_REWRITE_AUTO_FIX=0 or auto_fix=False: warn only):
        the session keeps the culprits' half nodes, and their twins under another top
        scope (``twin_nodes``: a target network's), float32 (ShadowGraph.heal: the same
        variables, slots, global_step, queues and iterators), restarts the loss scale
        from its initial value and says so; at most ``max_heals`` times, then a last
        warning and no more changes
    TFAMP_REWRITE_HEAL_FILE=path: the nodes kept float32 are written there (JSON), and a
        session started with it set keeps them float32 from its first run

With ``TFAMP_REWRITE_MONITOR=N`` every N-th loss-scaled step also carries the probes, for the
precision monitor's TensorBoard scalars (precision_monitor.py).
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..doctor.fixes import added_by_the_plugin
from ..doctor.heal_files import HEALS_BESIDE_CHECKPOINTS, write_heal_file
from ..doctor.limits import limits_for
from ..user_log import log_info
from .decompositions import DECOMPOSITIONS, nearest_half_producers
from .devices import first_time, log_once, nodes_to_exclude_setting
from .heal_memory import HEAL_FILE_ENV, forget_healed, remember_healed
from .loop_steps import LoopSteps
from .loss_scale import INITIAL_LOSS_SCALE_ENV
from .op_walks import ancestors, reachable, value_consumers
from .precision_monitor import PrecisionMonitor
from .shadow_graph import has_operation
from .skip_guard import SkipGuard
from .state_guard import WRITE_OPS, value_input, written_variable
from .step_diagnosis import Culprit, Finding, Float32Origin, StepDiagnosis
from .step_signals import has_step_signals, loss_scale_variables, step_signals
from .twins import DATA_INPUT_OPS, twin_nodes, weight_producers
from .unscaled_training import unguarded_writes
from .variable_check import VariableCheck

# Per thread: how many runs computed a loss-scaled step, and whether the last of them skipped
# it while the watch can still act on it.  Runs that compute no step leave both alone: hooks
# such as StepCounterHook run the session again (global_step) between a step and the
# NanTensorHook that asks.
_step_runs = threading.local()


def step_runs_so_far() -> int:
    """This thread's count of rewriting-session runs that computed a loss-scaled step."""
    return getattr(_step_runs, "count", 0)


def skipped_while_recovering_since(graph, count: int) -> bool:
    """True if this thread ran a loss-scaled step since ``step_runs_so_far()`` was ``count``,
    and the last such run, of a rewriting session on ``graph`` (the user's), skipped its step
    while the watch can still act on it (the scale can fall further, or a culprit can be
    healed): a NaN loss in that run updated no weight and need not end training
    (activation.py's NanTensorHook)."""
    return step_runs_so_far() > count and getattr(_step_runs, "recovering", None) is graph


def still_recovering(graph) -> None:
    """Marks this thread's last step run, of a rewriting session on ``graph``, as one the
    session still acts on (``skipped_while_recovering_since``): its inf/nan is being traced."""
    _step_runs.recovering = graph


def traced_run(graph) -> None:
    """Counts this thread's last run, of a rewriting session on ``graph`` (the user's), as
    one the session still acts on though it computed no loss-scaled step: it returned an
    inf/nan the session is tracing to its node (an evaluation before training starts), so a
    NanTensorHook watching it waits (``skipped_while_recovering_since``)."""
    _record_step_run(graph)


def skipped_for_good_since(count: int) -> bool:
    """True if this thread ran a loss-scaled step since ``step_runs_so_far()`` was ``count``,
    and the last such run skipped its step where the watch can no longer act on it (the
    scale at its floor, nothing found or nothing more to heal): such steps skip for good."""
    return (step_runs_so_far() > count and getattr(_step_runs, "skipped", False)
            and getattr(_step_runs, "recovering", None) is None)


def float32s_own_since(count: int) -> bool:
    """True if this thread's last loss-scaled step run, since ``step_runs_so_far()`` was
    ``count``, skipped for good on inf/nan the session traced to float32 itself (a float32
    op turning finite values inf/nan, fed inf/nan, weights holding them): float32 would have
    applied them, and its loss turned NaN a step later (activation.py's NanTensorHook)."""
    return skipped_for_good_since(count) and getattr(_step_runs, "float32s_own", False)


def frozen_since(count: int) -> bool:
    """True if this thread ran a loss-scaled step since ``step_runs_so_far()`` was ``count``,
    and by the last such run, ``FROZEN_AFTER`` runs in a row had skipped every step they
    computed for good: no weight and not global_step changes any more
    (activation.py's StopAtStepHook)."""
    return step_runs_so_far() > count and getattr(_step_runs, "frozen", False)


def _record_step_run(recovering_graph, skipped: bool = False, frozen: bool = False,
                     float32s_own: bool = False) -> None:
    _step_runs.count = step_runs_so_far() + 1
    _step_runs.recovering = recovering_graph
    _step_runs.skipped = skipped
    _step_runs.frozen = frozen
    _step_runs.float32s_own = float32s_own


AUTO_FIX_ENV = "TFAMP_REWRITE_AUTO_FIX"
# Heals per session: a deep regression on raw inputs (values of 1e5 in every layer's gradients)
# needs about one per layer; each imports the graph once more (its nodes, not its weights).
DEFAULT_MAX_HEALS = 16
# Runs in a row that skipped every step they computed, with nothing more the session can do,
# after which training is frozen: said once, and a StopAtStepHook ends training there, since
# global_step, which counts applied steps only, would never reach its last step.
FROZEN_AFTER = 100
_logger = logging.getLogger("tfamp_rewrite")
_said_probing = False  # building the probes is said once per process
_said_probing_pause = False  # a long first probed step: said once per process
PAUSE_SAID_AFTER = 5.0  # seconds: a first probed step slower than this is said
_FAILING_AGAIN = 2  # steps skipped on an inf/nan loss since the last heal, the last one too
# a heal's culprit of these ops is an input past half's range: the data's, kept at any close
_INPUT_OPS = DATA_INPUT_OPS | {"IteratorGetNextSync", "Const"}
# Applied steps per skipped one, at least, of a fall said to come from some batches only (a
# skip every other step is a scale too high for most batches, falling)
SPARSE_SKIPS_APART = 3
_said_heal_file_hint = False  # how other processes start healed: said once per process


@dataclass
class Heal:
    """One heal: what was kept float32, why, and the scale's trajectory before it."""

    nodes: List[str]
    culprit: str
    op: str
    held_by: str
    role: str
    max_abs: float
    trajectory: str
    env: str
    presumed: bool = False  # the culprit's half nodes were presumed to blame (Culprit.presumed)
    more_culprits: List[str] = field(default_factory=list)  # the step's others, healed with it
    gradients_only: bool = False  # every culprit a gradient too large for half at any scale


_auto_fix_default: Optional[bool] = None  # enable_mixed_precision_graph_rewrite(auto_fix=...)


def set_auto_fix_default(auto_fix: Optional[bool]) -> None:
    """Whether sessions created from now on heal (None: ``$TFAMP_REWRITE_AUTO_FIX`` decides)."""
    global _auto_fix_default
    _auto_fix_default = None if auto_fix is None else bool(auto_fix)


def auto_fix_setting(auto_fix: Optional[bool] = None, environ=None) -> bool:
    """``auto_fix``, else ``set_auto_fix_default``'s, else ``$TFAMP_REWRITE_AUTO_FIX`` (0/1), else on."""
    if auto_fix is not None:
        return bool(auto_fix)
    if _auto_fix_default is not None:
        return _auto_fix_default
    environ = os.environ if environ is None else environ
    value = environ.get(AUTO_FIX_ENV, "").strip().lower()
    if value in ("", "1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise ValueError("%s=%r is not a boolean; use 1/true or 0/false" % (AUTO_FIX_ENV, environ[AUTO_FIX_ENV]))


class StepWatch:
    """See the module docstring; one per rewriting session."""

    def __init__(self, shadow, auto_fix: bool, max_heals: Optional[int] = None,
                 heal_file: Optional[str] = None, monitor: Optional[PrecisionMonitor] = None,
                 run_private=None):
        self.shadow = shadow
        self._run_private = run_private  # runs private-graph fetches: reads between runs
        self._loop_steps = LoopSteps(shadow)
        self.monitor = monitor
        self.auto_fix = auto_fix
        self.max_heals = DEFAULT_MAX_HEALS if max_heals is None else max_heals
        self.heal_file = heal_file
        self.heals: List[Heal] = []
        self._guards: Dict[int, SkipGuard] = {}
        self._diagnosis: Optional[StepDiagnosis] = None
        self._variable_check: Optional[VariableCheck] = None
        self._generation = None
        self._computed: Dict[tuple, Tuple[List[int], List[int]]] = {}
        self._lock = threading.Lock()
        self._said_final = False
        self._said_skip = False     # the first skipped step is said once (INFO)
        self._said_settled = False  # a long episode ended without a culprit: said once
        self._said_variables = False  # weights holding inf/nan: said once
        self._said_feeds = False      # fed values holding inf/nan: said once
        self._said_float32_origin = False  # an inf/nan float32 makes itself: said once
        self._last_scales: Dict[int, Tuple[float, bool]] = {}  # per step: its last scale, applied
        self._said_reset = False      # a loss scale set back from outside: said once
        self._probed_kinds: set = set()  # the probe bundles fetched so far (each a new kind of run)
        self._probing_since: Optional[Tuple[float, int]] = None  # a first probed run: (start, probes)
        self._skipped_for_good = 0    # runs in a row whose every step skipped for good
        self._said_frozen = False     # training frozen: said once
        self._settled_steps: set = set()  # ids of the signals whose settled scale was said
        self._constants_seen: Optional[Tuple[int, List[str]]] = None  # (version, inf/nan constants)
        self._since_heal = [0, 0]     # steps applied, and skipped on an inf/nan loss, since the last heal
        self._last_failed = False     # whether the latest step skipped on an inf/nan loss
        self._heals_forgotten = False  # taken back for later sessions (their steps failed anyway)
        self._forgotten: List[str] = []  # the nodes taken back

    # -- before a run ----------------------------------------------------------------------
    def extra_fetches(self, elements, fed):
        """``(fetches, probe ids)``: what a run of ``elements`` (private graph) fetches besides
        -- the steps it computes (flag and scale each), and on a diagnosed step the probes it
        computes anyway -- or None when it computes no loss-scaled step."""
        if not has_step_signals(self.shadow.user_graph):  # inference only: nothing to watch
            return None
        with self._lock:
            signals = step_signals(self.shadow.user_graph)
            steps = self._step_fetches(signals, elements, fed)
            if not steps:
                self._note_unwatched(signals, elements, fed)
                return None
            extra = {"steps": steps}
            ids = ()
            monitored = self.monitor is not None and self.monitor.due_next()
            diagnosed = any(self._guard(signals[i]).diagnosis_due for i in steps)
            if monitored or diagnosed:
                start = time.perf_counter()
                ids, tensors = self._diagnosis_now().fetches(elements, fed, monitor_only=not diagnosed)
                if ids:
                    extra["probes"] = tensors
                    if tensors not in self._probed_kinds:
                        self._probed_kinds.add(tensors)
                        self._probing_since = (start, len(ids))
            return extra, ids

    def step_fetches(self, elements, fed):
        """The steps part alone of ``extra_fetches`` (``{signal index: (flag, scale)}``, or
        None): for a callable, whose fetches are fixed when it is made.  Its calls are
        observed (``after_run`` with ``{"steps": values}``); one that ``diagnosis_due`` asks
        for is made as a run instead, which fetches the probes."""
        with self._lock:
            return self._step_fetches(step_signals(self.shadow.user_graph), elements, fed) or None

    def diagnosis_due(self, steps) -> bool:
        """Whether the next run of the loss-scaled steps ``steps`` (signal indices) is to
        fetch the probes: a run of skipped steps asks to be diagnosed."""
        with self._lock:
            signals = step_signals(self.shadow.user_graph)
            return any(self._guard(signals[i]).diagnosis_due for i in steps if i < len(signals))

    def _step_fetches(self, signals, elements, fed) -> Dict[int, tuple]:
        self._follow_generation()
        graph = self.shadow.user_graph
        return {i: tuple(self.shadow.private_fetch(t) for t in _flag_and_scale(signals[i])
                         + _loss_flag(signals[i], graph))
                for i in self._steps_computed(signals, elements, fed)[0]}

    def _global_step(self):
        """The user graph's global_step in the private graph, or None."""
        import tensorflow as tf

        step = tf.compat.v1.train.get_global_step(self.shadow.user_graph)
        return None if step is None else self.shadow.private_fetch(step)

    def _follow_generation(self) -> None:
        generation = (self.shadow.private_name(""), self.shadow.rewrites)
        if generation != self._generation:
            self._generation, self._diagnosis, self._variable_check = generation, None, None
            self._computed.clear()

    def _steps_computed(self, signals, elements, fed) -> Tuple[List[int], List[int]]:
        """The dynamically scaled steps a run of ``elements`` computes: those it can watch
        (their flag and scale fetched as they are, or as passed out of the user's TF1 conds),
        and those inside a TF1 while loop, whose flag and scale cannot be fetched."""
        key = (tuple(getattr(e, "name", str(e)) for e in elements), tuple(sorted(t.name for t in fed)))
        cached = self._computed.get(key)
        if cached is None:
            computed = ancestors(elements, {t.name for t in fed})
            graph = self.shadow.user_graph
            steps = [i for i, s in enumerate(signals) if _is_dynamic(s.loss_scale)
                     and s.all_finite.graph is graph
                     and private_step_op(self.shadow, s) in computed]
            watched = [i for i in steps if all(graph.is_fetchable(t) for t in _flag_and_scale(signals[i]))]
            cached = self._computed[key] = (watched, [i for i in steps if i not in watched])
        return cached

    def say_unwatched_in_partial_runs(self, elements, fed=()) -> None:
        """Says once that a partial run's loss-scaled steps (of ``elements``, private graph)
        are not watched: a partial run cannot fetch their flags beside its own fetches."""
        if not has_step_signals(self.shadow.user_graph):
            return
        with self._lock:
            signals = step_signals(self.shadow.user_graph)
            steps = [i for group in self._steps_computed(signals, elements, fed) for i in group]
        if steps:
            log_once("tfamp_rewrite: a partial run computes a loss-scaled step (the one whose "
                     "finite flag is %r), whose flag it cannot fetch beside its own fetches: its "
                     "skipped steps are not said, diagnosed or healed, though the loss scale "
                     "still falls on each. Run the step with Session.run to have it watched "
                     "(said once)" % signals[steps[0]].all_finite.name)

    def _note_unwatched(self, signals, elements, fed) -> None:
        """A run whose loss-scaled steps all lie inside TF1 control flow: said once, and
        counted as a step run (it is one; no inference line)."""
        unwatched = self._steps_computed(signals, elements, fed)[1]
        if not unwatched:
            return
        _record_step_run(None)
        if self._run_private is not None:  # training frozen in the loop: said once
            self._loop_steps.before_run([signals[i] for i in unwatched], self._run_private)
        log_once(
            "tfamp_rewrite: a loss-scaled step runs inside a TF1 tf.while_loop (its finite "
            "flag %r cannot be fetched there), so sessions do not see its skipped "
            "steps: they are not said, diagnosed or healed, though the loss scale still "
            "falls on each. Call apply_gradients outside the loop to have them watched "
            "(said once)" % signals[unwatched[0]].all_finite.name, key="a step in a while loop")

    def _guard(self, signal) -> SkipGuard:
        guard = self._guards.get(id(signal))
        if guard is None:
            guard = self._guards[id(signal)] = SkipGuard(signal.loss_scale.min_loss_scale)
        return guard

    def _diagnosis_now(self) -> StepDiagnosis:
        global _said_probing
        if self._diagnosis is None:
            if not _said_probing:
                _said_probing = True
                log_info("tfamp_rewrite: adding range probes for the graph's %s tensors and the "
                         "float32 values around them, to diagnose (once per graph, and again after "
                         "each heal; on a graph of thousands of nodes this takes a while)"
                         % self.shadow.dtype)
            user_def, result = self.shadow.half_rewrite()
            self._diagnosis = StepDiagnosis(user_def, result.graph_def, result.report, self.shadow.graph,
                                            self.shadow.private_name, limits_for(self.shadow.dtype))
        return self._diagnosis

    # -- after it ----------------------------------------------------------------------------
    def after_run(self, extra_values: dict, ids, run_private, feeds=None) -> None:
        """Records the run's steps; names and heals a culprit its probes (``ids``) found.

        ``run_private(fetches)`` runs private-graph fetches (no feeds) and returns their
        values: the weights' finite checks, and the loss scales' initializers after a heal.
        ``feeds``: the run's feed dict (private graph), looked at when a diagnosis is due.
        """
        with self._lock:
            signals = step_signals(self.shadow.user_graph)
            steps = steps_that_ran(extra_values["steps"])
            losses_not_finite = _losses_not_finite(extra_values["steps"])
            several = len(signals) > 1
            for i, (all_finite, scale) in steps.items():
                guard = self._guard(signals[i])
                self._note_scale(i, float(scale), bool(all_finite), signals[i].loss_scale)
                ended = guard.observe(float(scale), bool(all_finite), loss_finite=i not in losses_not_finite)
                # a loss the forward pass made inf/nan: the step fails whatever the scale
                self._last_failed = not all_finite and i in losses_not_finite
                self._since_heal[0] += bool(all_finite)
                self._since_heal[1] += self._last_failed
                if not all_finite:  # the other loss scales whose steps skipped in this run
                    others = len({id(signals[j].loss_scale) for j, (finite, _) in steps.items()
                                  if not finite} - {id(signals[i].loss_scale)})
                    self._say_first_skip(float(scale), signals[i], several, others,
                                         loss_finite=i not in losses_not_finite)
                elif ended is not None and not ended.named and guard.fell_far(ended, min(ended.scales)):
                    self._say_settled(ended, float(scale), signals[i], several)
            if self.monitor is not None and steps:
                self._sample(dict(extra_values, steps=steps), ids, run_private)
            if "probes" in extra_values:
                self._say_probing_pause()
            if "probes" in extra_values and steps:
                self._diagnose(dict(extra_values, steps=steps), ids, signals, run_private, feeds)
            skipped = [i for i, (finite, _) in steps.items() if not finite]
            recovering = skipped and all(self._can_recover(self._guard(signals[i])) for i in skipped)
            for_good = bool(skipped) and not recovering and len(skipped) == len(steps)
            self._skipped_for_good = self._skipped_for_good + 1 if for_good else 0
            frozen = self._skipped_for_good >= FROZEN_AFTER
            if frozen:
                self._say_frozen()
            float32s_own = bool(skipped) and all(self._guard(signals[i]).episode is not None
                                                 and self._guard(signals[i]).episode.float32s_own
                                                 for i in skipped)
            _record_step_run(self.shadow.user_graph if recovering else None, skipped=bool(skipped),
                             float32s_own=float32s_own,
                             frozen=frozen)

    def _say_frozen(self) -> None:
        """Says, once, that ``FROZEN_AFTER`` runs in a row skipped every step for good."""
        if self._said_frozen:
            return
        self._said_frozen = True
        if self.auto_fix and len(self.heals) >= self.max_heals:
            cause = ("The session reached its limit of %d heals, so the inf/nan may still be %s's: "
                     "the heals' settings above, applied together, may mend it" % (
                         self.max_heals, self.shadow.dtype))
        elif not self.auto_fix:
            cause = ("Healing is off (%s=0), so the inf/nan may be %s's: the settings above may "
                     "mend it" % (AUTO_FIX_ENV, self.shadow.dtype))
        else:
            cause = "Float32 would have applied these steps' inf/nan updates"
        _logger.warning(
            "tfamp_rewrite: training is frozen: the last %d runs skipped every loss-scaled step "
            "they computed, and the session can do nothing more about them (the lines above say "
            "why); no weight has changed since and global_step, "
            "which counts applied steps only, stays where it is. A StopAtStepHook (Estimator."
            "train(steps=...) or max_steps) ends training here rather than wait for ever; a loop "
            "that runs until global_step reaches a count does not end. %s (said once)"
            % (FROZEN_AFTER, cause))

    def _say_probing_pause(self) -> None:
        """After the first run fetching a bundle of probes: says, once, a pause it made the
        user wait (building the probes, TensorFlow optimizing the step with them)."""
        global _said_probing_pause
        if self._probing_since is None:
            return
        (start, probes), self._probing_since = self._probing_since, None
        took = time.perf_counter() - start
        if took < PAUSE_SAID_AFTER:
            return
        if not _said_probing_pause:
            _said_probing_pause = True
            log_info("tfamp_rewrite: the first step fetching the range probes of %d %s tensors took "
                     "%.1f s: TensorFlow optimizes and prepares a step with them once per kind of "
                     "run; the steps after it take as long as before (said once)"
                     % (probes, self.shadow.dtype, took))
        elif self.heals and first_time("a probed step paused after a heal"):
            log_info("tfamp_rewrite: after the heal, the first step fetching the range probes took "
                     "%.1f s again: each heal imports a new generation of the graph, which "
                     "TensorFlow optimizes and prepares anew with its probes (said once)" % took)

    def _note_scale(self, i: int, scale: float, applied: bool, loss_scale) -> None:
        """Says, once, a dynamic loss scale that rose between two steps of its train op by
        more than a step raises it (a skipped one never does; an applied one multiplies it
        at most once): its variables were initialized again or restored."""
        last = self._last_scales.get(i)
        self._last_scales[i] = (scale, applied)
        if last is None or self._said_reset or not _is_dynamic(loss_scale):
            return
        before, before_applied = last
        if scale <= (before * float(loss_scale.multiplier) if before_applied else before):
            return
        self._said_reset = True
        _logger.warning(
            "tfamp_rewrite: the loss scale a training step used went from %g to %g in its next "
            "step, which no step does: its variables were initialized again (tf.variables_"
            "initializer(opt.variables()) includes them, as with TensorFlow's own loss-scale "
            "optimizer) or restored. Each time it starts again from there and falls by skipping "
            "steps until the gradients fit; a program that resets its optimizer per task (Reptile) "
            "loses steps in every task. To keep the scale it found, initialize [v for v in "
            "opt.variables() if 'loss_scale' not in v.name] instead (said once)" % (before, scale))

    def _diagnose(self, extra_values: dict, ids, signals, run_private, feeds=None) -> None:
        """Names (and heals) a culprit the run's probes show, for each guard that asked;
        weights or fed values holding inf/nan come first, as nothing else is to blame then,
        and state the step reads (a memory bank) before a presumed culprit."""
        counts, extrema = extra_values["probes"]
        for i, (all_finite, scale) in extra_values["steps"].items():
            guard = self._guard(signals[i])
            if not guard.diagnosis_due or bool(all_finite):
                continue  # an applied step shows no culprit: the next run carries the probes again
            nonfinite = self._nonfinite_variables(run_private)
            state = [n for n in nonfinite if n in self._variable_check.state]
            if len(state) < len(nonfinite):  # the weights themselves
                guard.diagnosed(named=True)
                guard.episode.float32s_own = True
                self._say_variables_not_finite(nonfinite, guard)
                continue
            # a fed inf/nan is no culprit's doing, and what reads it is its victim
            fed = [self.shadow.user_name(name) for name in _nonfinite_feeds(feeds)]
            fed += self._nonfinite_constants()
            finding = self._diagnosis_now().find(ids, counts, extrema, float(scale), guard.at_floor,
                                                 nonfinite_inputs=fed)
            if state and (finding is None or all(c.presumed for c in finding.culprits)):
                # state the step reads holds inf/nan: what turns inf/nan from it is its victim;
                # a half tensor overflowing on its own (a conv before a batch norm whose
                # unguarded averages are NaN) is still a culprit, and healed
                guard.diagnosed(named=True)
                self._say_variables_not_finite(state, guard)
                continue
            guard.diagnosed(named=finding is not None or bool(fed))
            if finding is not None and finding.culprits:
                self._named(finding, guard, signals, run_private, _whose_steps(signals[i], len(signals) > 1))
                return
            if finding is not None:
                guard.episode.float32s_own = True
                self._say_made_in_float32(finding.float32_origins[0], guard)
            elif fed:
                guard.episode.float32s_own = True
                self._say_feeds_not_finite(fed, guard)
            elif guard.at_floor:
                self._nothing_found(guard)

    @staticmethod
    def _can_recover(guard: SkipGuard) -> bool:
        """Whether the watch may still end the episode of a step ``guard`` saw skipped: the
        scale can fall further, a diagnosis is to come, or a heal just restarted it."""
        episode = guard.episode
        if episode is None:  # a heal in this run restarted the scale
            return True
        if episode.named:    # a culprit it could not heal (healing off, Horovod, the limit)
            return False
        return not (guard.at_floor and episode.diagnosed_at_floor)

    def _sample(self, extra_values: dict, ids, run_private) -> None:
        """Counts the step for the monitor and writes its scalars when it is a sampled one,
        at ``global_step`` as the step left it: read after the run (``run_private``), as
        nothing orders a read in the run and the step's increment of a resource variable."""
        steps = extra_values["steps"].values()
        sampled = self.monitor.count(skipped=not all(bool(finite) for finite, _ in steps))
        if not sampled:
            return
        probes = self._diagnosis_now().ops.probes
        counts = extra_values["probes"][0] if "probes" in extra_values else []
        global_step = self._global_step()
        step = None if global_step is None else run_private([global_step])[0]
        self.monitor.write(None if step is None else int(step), min(float(s) for _, s in steps),
                           len(self.heals), [probes[i] for i in ids], counts)

    def _nonfinite_variables(self, run_private) -> List[str]:
        if self._variable_check is None:
            graph = self.shadow.user_graph
            read = {op.name for op in ancestors([s.all_finite for s in step_signals(graph)
                                                 if s.all_finite.graph is graph])}
            self._variable_check = VariableCheck(graph, self.shadow.graph, self.shadow.private_fetch,
                                                 read)
        return self._variable_check.nonfinite(run_private)

    def _restart_loss_scales(self, signals, run_private) -> str:
        """Runs the initializers of ``signals``' loss-scale variables (after a heal); returns
        what the heal's line says of it."""
        self._last_scales.clear()
        with self.shadow.user_graph.as_default():
            initializers = [v.initializer for v in loss_scale_variables(signals)]
        if initializers:
            run_private([self.shadow.private_fetch(op) for op in initializers])
        # from the top again: gradients too large for it skip a few steps more while it falls
        falls = " (steps whose gradients are too large for it skip again while it falls)"
        if len(signals) > 1:
            return "; every loss scale of the graph restarts from its initial value" + falls
        return "; the loss scale restarts from its initial value" + falls

    def _named(self, finding: Finding, guard: SkipGuard, signals, run_private, which: str = "") -> None:
        trajectory = guard.episode.trajectory()
        culprit = finding.culprits[0]
        # The same layers under another top scope (a target network) are kept with them.
        twins = twin_nodes(self.shadow.user_graph, finding.half_nodes, self.shadow.converted_now())
        heal = Heal(nodes=list(finding.half_nodes), culprit=culprit.tensor, op=culprit.op,
                    held_by=culprit.held_by, role=culprit.role, max_abs=culprit.max_abs,
                    trajectory=trajectory, env=finding.fix.env, presumed=culprit.presumed,
                    more_culprits=[c.tensor for c in finding.culprits[1:]],
                    gradients_only=all(c.role != "forward" for c in finding.culprits))
        they = "them" if len(finding.culprits) > 1 else "it"
        collective = _runs_collectives(self.shadow.user_graph)
        can_heal = self.auto_fix and not collective and len(self.heals) < self.max_heals
        if not self.auto_fix:
            then = "healing is off (%s=0): the steps keep being skipped" % AUTO_FIX_ENV
        elif collective:
            then = ("healing is off in a Horovod job: a heal renames this rank's graph, and ranks "
                    "running different graphs wait on each other for ever, so set it on every rank "
                    "and restart")
        elif can_heal:
            then = "healing: this session keeps %s float32 from now on (heal %d of at most %d)" % (
                they, len(self.heals) + 1, self.max_heals)
        else:
            then = "no more heals in this session"
        _logger.warning(_finding_message(finding, twins, which, trajectory, self.shadow.dtype, then))
        if not can_heal:
            if self.auto_fix and not collective and not self._said_final:
                self._said_final = True
                _logger.warning("tfamp_rewrite: %d heals already in this session (the limit); it "
                                "changes nothing more -- apply the edits above and restart%s"
                                % (self.max_heals, "" if self.heal_file else
                                   ", or run again with %s=path set: each run then writes its "
                                   "heals there and the next starts from them, so heals beyond "
                                   "one session's limit add up over runs" % HEAL_FILE_ENV))
            return
        if heal.gradients_only and self.heals and self.heals[-1].gradients_only:
            # The gradient flowing on past the last heal's is as large: restarting the scale
            # would cost a fall to the floor (15 skipped steps) for each layer of the chain.
            then = ("; the loss scale stays where it is, as the heal before this one also kept "
                    "float32 gradients too large for %s at any scale: the next of such a chain "
                    "is named within a step or two, and the scale grows again as usual"
                    % self.shadow.dtype)
        else:
            then = self._restart_loss_scales(signals, run_private)
        self._heal(heal, finding.half_nodes, twins, then)

    def scale_may_recover(self) -> bool:
        """Whether every step's skips may still end without the session's help elsewhere:
        the scale can fall further, or a diagnosis is to come (``_can_recover``)."""
        return all(self._can_recover(guard) for guard in self._guards.values())

    def can_heal(self) -> bool:
        """Whether this session may heal once more (healing on, no Horovod, under the limit)."""
        return (self.auto_fix and not _runs_collectives(self.shadow.user_graph)
                and len(self.heals) < self.max_heals)

    def heal_origin(self, nodes: List[str], tensor: str, op: str, why: str, env: str,
                    run_private=None) -> bool:
        """Keeps ``nodes`` float32: where an inf/nan started (``tensor``, its node's ``op``;
        ``env``, the list edit that keeps them float32), as the origin search found it in
        a run no skipped step diagnosed (``why``, the trajectory's stand-in).  With
        ``run_private`` (its step skipped) the loss scales restart from their initial
        values, as after a skipped step's heal.  Returns whether it healed (``can_heal``)."""
        with self._lock:
            if not self.can_heal():
                return False
            kept = set(self.shadow.kept_float32)
            if all(name in kept for name in nodes):  # the same run's skipped step healed them
                return True
            nodes = [name for name in nodes if name not in kept]
            twins = twin_nodes(self.shadow.user_graph, nodes, self.shadow.converted_now())
            heal = Heal(nodes=list(nodes), culprit=tensor, op=op, held_by=nodes[0], role="forward",
                        max_abs=float("inf"), env=env, trajectory=why)
            then = ("" if run_private is None
                    else self._restart_loss_scales(step_signals(self.shadow.user_graph), run_private))
            # the search found it in a run whose values the unhealed graph computed
            then += "; runs from the next on compute with it (the values this run returned did not)"
            then += self._written_before_heal(nodes)
            self._heal(heal, nodes, twins, then)
            return True

    def _written_before_heal(self, nodes: List[str]) -> str:
        """A clause naming the variables that writes computed from ``nodes`` (user graph)
        store in -- k-means' centroids assigned from an overflowed ArgMin: the runs before
        the heal wrote them from the inf/nan -- or ''."""
        written = self._written_from(nodes)
        if not written:
            return ""
        return ("; the runs before it wrote values computed from it into %s %s, which keep%s them "
                "until written again" % ("variable" if len(written) == 1 else "variables",
                                         _some(written, 3), "s" if len(written) == 1 else ""))

    def _written_from(self, nodes: List[str]) -> List[str]:
        """The variables (names) writes computed from ``nodes`` (user graph) store in, but
        the loss scales'."""
        graph = self.shadow.user_graph
        ops = [graph.get_operation_by_name(name) for name in nodes if has_operation(graph, name)]
        scales = {v.op.name for v in loss_scale_variables(step_signals(graph))}
        # values only: Adam's beta1_power update waits on each ApplyAdam by a control edge,
        # and sits in the skip cond whose predicate the gradients decide, but what it writes
        # is not computed from the healed nodes
        computed = reachable(ops, value_consumers)
        return sorted({written_variable(op) for op in computed
                       if op.type in WRITE_OPS and len(op.inputs) > value_input(op.type)
                       and op.inputs[value_input(op.type)].op in computed} - {None} - scales)

    def _heal(self, heal: Heal, culprits: List[str], twins: List[str], then: str) -> None:
        """The heal itself: ``heal``'s nodes and their ``twins`` float32 from now on, kept in
        the process and the heal file, and said."""
        converted = self.shadow.converted_now()
        reads = {name for name in twins if name in weight_producers(
            self.shadow.user_graph, [n for n in list(culprits) + list(twins) if n != name], converted)}
        heal.nodes += twins
        report = self.shadow.heal(heal.nodes)
        self.heals.append(heal)
        remember_healed(self.shadow.user_graph, heal.nodes)
        self._since_heal = [0, 0]
        for each in self._guards.values():
            each.restart(after_heal=True)
        self._write_heal_file()
        layers = [name for name in twins if name not in reads]
        with_twins = (", with %s, the same layer%s elsewhere (under another scope: a target "
                      "network, a tower, a function called again; or the same weights applied to "
                      "other values: SSIM's other filters)"
                      % (_some(layers, 4), "s" if len(layers) > 1 else "") if layers else "")
        if reads:
            # "weights": values of constants and variables alone (a portfolio's share counts too)
            with_twins += ", and %s, computing the weights %s read (from constants and variables)" % (
                _some(sorted(reads), 4), "they" if len(culprits) + len(layers) > 1 else "it")
        users = [n for n in culprits if not added_by_the_plugin(n)] or culprits
        _logger.warning("tfamp_rewrite: healed: %s now float32%s (%d node(s) still %s)%s%s" % (
                            _some(users), with_twins, report.nodes_converted, self.shadow.dtype, then,
                            self._heal_file_hint()))

    def _heal_file_hint(self) -> str:
        """Once per process, without a heal file: how other processes start healed."""
        global _said_heal_file_hint
        if self.heal_file or _said_heal_file_hint:
            return ""
        _said_heal_file_hint = True
        return (". Later sessions of this process start healed; another process (an evaluation, "
                "the next training run) does so when it restores a checkpoint this session saves "
                "with a Saver (the heals are written beside it, %s), or with %s=path set in both, "
                "which this one then writes (said once)" % (HEALS_BESIDE_CHECKPOINTS, HEAL_FILE_ENV))

    def _say_first_skip(self, scale: float, signal, several: bool, others: int = 0,
                        loss_finite: bool = True) -> None:
        """Said once per process: a sweep's every trial, a k-fold's every session skips its
        first steps alike.  ``others``: how many other optimizers' steps skipped in the run
        (an ensemble's members, each its own loss scale)."""
        if self._said_skip or not first_time("a training step was skipped"):
            return
        self._said_skip = True
        which = _whose_steps(signal, several, "the step")
        if others:
            also = "in the same run %d other optimizer%s step%s too, each with its own loss scale" % (
                others, "s'" if others > 1 else "'s", "s" if others > 1 else "")
            which = which[:-1] + "; " + also + ")" if which else " (" + also + ")"
        if loss_finite:
            then = "a long run of such steps is diagnosed"
        else:
            then = ("its loss itself was inf/nan, which no loss scale makes or mends (a forward "
                    "value, not a gradient), so the next skipped step is diagnosed")
        log_info("tfamp_rewrite: a training step was skipped%s: its gradients were not all finite "
                 "at loss scale %g, so its optimizer applied no update (a global_step it advances "
                 "stays where it is: it counts applied steps only) and the scale was lowered; %s "
                 "(said once)"
                 % (which, scale, then))

    def _say_settled(self, episode, scale: float, signal, several: bool) -> None:
        """Said once per process; where several optimizers of this session's graph settle
        (an ensemble's members), each other one then gets a line of its own, once."""
        which = _whose_steps(signal, several)
        if self._said_settled:
            if several and id(signal) not in self._settled_steps:
                self._settled_steps.add(id(signal))
                log_info("tfamp_rewrite: training steps%s were skipped until their own loss scale "
                         "fell far enough too: %s, then steps applied at %g (said once per "
                         "optimizer)" % (which, episode.trajectory(), scale))
            return
        if not first_time("the loss scale settled"):
            return
        self._said_settled = True
        self._settled_steps.add(id(signal))
        between = episode.applied - episode.applied_in_a_row
        if between >= SPARSE_SKIPS_APART * episode.skipped:  # skips now and then, among applied steps
            _logger.warning(
                "tfamp_rewrite: training steps%s were skipped now and then, and each skip halved the "
                "loss scale: %s, then steps applied at %g. Skips this sparse come from some "
                "batches only (a rare large input, a %s value past its range in some batches), "
                "not from gradients too large for the initial scale: starting lower would cost "
                "every other batch precision, and the scale grows back after %s finite steps in "
                "a row. The diagnosed steps named no tensor past %s range at every scale; "
                "TFAMP_REWRITE_MONITOR=1 records which tensors overflow in each step, skipped "
                "ones included (said once)" % (
                    which, episode.trajectory(), scale, self.shadow.dtype,
                    _increment_period(signal), self.shadow.dtype))
            return
        floor = getattr(signal.loss_scale, "min_loss_scale", None)
        if floor is not None and scale <= float(floor):
            _logger.warning(
                "tfamp_rewrite: training steps%s were skipped until the loss scale fell to its "
                "floor: %s, then steps applied at %g. The gradients are about as large as %s "
                "holds unscaled, so the scale gives small ones no headroom, and a lower initial "
                "scale would only save the first skips: a step whose gradients pass %s's range "
                "even at the floor skips, is diagnosed, and the tensor past it is kept float32 "
                "(said once)" % (which, episode.trajectory(), scale, self.shadow.dtype,
                                 self.shadow.dtype))
            return
        _logger.warning(
            "tfamp_rewrite: training steps%s were skipped until the loss scale fell far enough: %s, "
            "then steps applied at %g; the optimizer applied no update in the skipped steps. No "
            "tensor stayed out of %s range at the lower scales so far, so nothing %sis kept "
            "float32 for them: the gradients are large for the initial scale. LossScaleOptimizer(opt, "
            "DynamicLossScale(initial_loss_scale=%g)), or %s=%g for the optimizers automatic loss "
            "scaling wraps (a canned Estimator's), starts where this run settled. Batches that "
            "overflow only now and then (a rare large input) skip again later, and are diagnosed "
            "then (said once)" % (which, episode.trajectory(), scale, self.shadow.dtype,
                                  "more " if self.heals else "", scale, INITIAL_LOSS_SCALE_ENV, scale))

    def _say_variables_not_finite(self, names: List[str], guard: SkipGuard) -> None:
        if self._said_variables:
            return
        self._said_variables = True
        writers = {variable: write for write, variable in
                   unguarded_writes(self.shadow.user_graph).items() if variable in names}
        # a phase retrieval's init assigned from a half MatMul that overflowed, since healed
        before_heals = sorted(set(names) & set(self._written_from([n for h in self.heals for n in h.nodes])))
        if writers:
            variable, write = next(iter(writers.items()))
            cause = ("%r wrote a skipped step's inf/nan gradients into %r (said when it first "
                     "ran): compute it from finite gradients only" % (write, variable))
        elif before_heals:
            cause = ("Runs before a heal of this session wrote %s's inf/nan into %r (said with the "
                     "heal): assign it again (run its initialization or the write once more), or "
                     "restore it from a checkpoint saved before; the heal stays"
                     % (self.shadow.dtype, before_heals[0]))
        elif all(n in self._variable_check.state for n in names):
            cause = ("A write of an earlier run put it there: one the session does not keep "
                     "inf/nan out of (it guards assignments, scatters and slice assignments of "
                     "values computed in %s), or a restored checkpoint" % self.shadow.dtype)
        else:
            cause = ("Mixed precision did not cause it. Look at where the weights diverged (a "
                     "checkpoint restored from a run that diverged, an assignment, or a float32 "
                     "update that overflowed)")
            if self.heals:
                cause += (". The %d heal(s) of this session did not stop it either: later "
                          "sessions of this process start without them%s"
                          % (len(self.heals), self._forget_heals()))
        state = [n for n in names if n in self._variable_check.state]
        _logger.warning(
            "tfamp_rewrite: training steps are being skipped (loss scale %s) because %s not "
            "finite: %s %s holds inf/nan%s, so the forward pass is not finite in float32 either, "
            "and no loss scale or float32 node can undo it: nothing is healed. %s" % (
                guard.episode.trajectory(),
                "state the steps read is" if state == names else "the model's own weights are",
                "variable" if state == names else "trainable variable",
                ", ".join(repr(n) for n in names[:3]),
                " (and %d more)" % (len(names) - 3) if len(names) > 3 else "", cause))

    def _say_made_in_float32(self, origin: Float32Origin, guard: SkipGuard) -> None:
        taken_back = self._take_back_presumed(origin.tensor)
        if self._said_float32_origin:
            return
        self._said_float32_origin = True
        _logger.warning(
            "tfamp_rewrite: training steps are being skipped (loss scale %s) because float32 %r "
            "(%s) turns finite values into inf/nan: it %s %s, which no %s tensor computes, so the "
            "step is not finite in float32 either and no loss scale or float32 node can undo it: "
            "nothing is healed. Mixed precision did not cause it, and the skipped steps keep these "
            "inf/nan out of the weights, which a float32 run would update with them. Guard the "
            "operation where it can fail (a loss divided by a count of positives that can be 0 "
            "wants tf.maximum(count, 1); a log wants a floor)%s (said once)" % (
                guard.episode.trajectory(), origin.tensor.split(":")[0], origin.op, origin.does,
                " and ".join(repr(t) for t in origin.operands), self.shadow.dtype, taken_back))

    def _take_back_presumed(self, tensor: str) -> str:
        """Takes back, for later sessions and what is written beside checkpoints, the heals
        that presumed the half nodes upstream of float32 ``tensor`` made its inf/nan, now
        that it turns out float32's own; what the line saying so adds."""
        nodes = [n for heal in self.heals if heal.presumed and heal.culprit == tensor for n in heal.nodes
                 if n in self.shadow.kept_float32]
        if not nodes:
            return ""
        forget_healed(self.shadow.user_graph, nodes)
        self.shadow.kept_float32.difference_update(nodes)
        self._write_heal_file()
        return (". The heal of %s, presumed to cause it, is taken back: later sessions and the "
                "checkpoints saved from now on do not keep it float32" % _some(nodes))

    def _say_feeds_not_finite(self, names: List[str], guard: SkipGuard) -> None:
        if self._said_feeds:
            return
        self._said_feeds = True
        constants = [n for n in names if n in self._nonfinite_constants()]
        how = ("was fed inf/nan" if not constants else "reads a constant holding inf/nan"
               if len(constants) == len(names) else "was fed, or reads a constant holding, inf/nan")
        _logger.warning(
            "tfamp_rewrite: training steps are being skipped (loss scale %s) because the run %s: "
            "%s holds inf/nan, so the step's loss is not finite in float32 either "
            "and no loss scale or float32 node can undo it: nothing is healed. Look at where the "
            "value came from; one an earlier run returned (a target network's Q values, a "
            "model's own predictions, a style target's Gram matrix baked in as a constant) may "
            "have overflowed in float16 there, in a run that computes no loss-scaled step and is "
            "never healed: keep that run's overflowing node float32 (tfamp-rewrite doctor names "
            "it)" % (guard.episode.trajectory(), how, ", ".join(repr(n) for n in names[:3])))

    def _nonfinite_constants(self) -> List[str]:
        """The floating constants of the user graph holding inf or nan (``"Const:0"``), looked
        at once per graph version: a value an earlier run returned, baked into the graph."""
        graph = self.shadow.user_graph
        if self._constants_seen is None or self._constants_seen[0] != graph.version:
            import tensorflow as tf

            found = []
            for op in graph.get_operations():
                if op.type == "Const" and op.outputs[0].dtype.is_floating:
                    value = tf.make_ndarray(op.get_attr("value"))
                    if not np.isfinite(value).all():
                        found.append(op.outputs[0].name)
            self._constants_seen = (graph.version, found)
        return self._constants_seen[1]

    def _nothing_found(self, guard: SkipGuard) -> None:
        horovod = (", or on another rank of this Horovod job, which names it"
                   if _runs_collectives(self.shadow.user_graph) else "")
        # "every step" only where none applied between the skips (batches that overflow
        # now and then leave the others applied)
        skipped = "steps keep being skipped" if guard.episode.applied else "every step is skipped"
        if self.heals:
            _logger.warning(
                "tfamp_rewrite: %s (loss scale %s) after %d heal(s) in this "
                "session, and no half tensor the step computes holds inf/nan or values beyond %s: "
                "the model most likely fails in float32 as well (a learning rate that diverges), "
                "so later sessions of this process start without these heals%s. If it trains in "
                "float32, the culprit sits inside a while loop or cond, which cannot be probed: "
                "run tfamp-rewrite doctor on the program%s" % (
                    skipped, guard.episode.trajectory(), len(self.heals), self.shadow.dtype,
                    self._forget_heals(), horovod))
            return
        _logger.warning(
            "tfamp_rewrite: %s (loss scale %s) and no half tensor the step computes holds "
            "inf/nan or values beyond %s: the culprit may sit inside a while loop or cond, which "
            "cannot be probed, or be float32 already%s%s%s; run tfamp-rewrite doctor on the program"
            % (skipped, guard.episode.trajectory(), self.shadow.dtype, self._programs_own_half(),
               self._decompositions_of_half(), horovod))

    def _decompositions_of_half(self) -> str:
        """A clause naming a float32 decomposition of a matrix half nodes computed (a GP's
        Cholesky of a kernel matrix rounding made indefinite fills NaN from finite values,
        which no probe sees), and the setting keeping those nodes float32, or ''."""
        graph, converted = self.shadow.user_graph, self.shadow.converted_now()
        for op in graph.get_operations():
            if op.type in DECOMPOSITIONS and op.name not in converted:
                half = [each.name for each in nearest_half_producers(op, lambda each: each.name in converted)]
                if half:
                    return (", or be %r (%s), which decomposes a matrix %s nodes computed from finite "
                            "values: rounding can leave a covariance or kernel matrix indefinite, and "
                            "the decomposition NaN -- %s keeps them float32" % (
                                op.name, op.type, self.shadow.dtype,
                                nodes_to_exclude_setting(["^%s$" % re.escape(name) for name in half])))
        return ""

    def _programs_own_half(self) -> str:
        """A clause naming the nodes the program itself computes in half (its own casts: a
        float16 model written by hand), which the probes leave alone, or ''."""
        own = [op.name for op in self.shadow.user_graph.get_operations()
               if op.type not in ("Cast", "Const", "Placeholder") and not op.type.startswith("Variable")
               and any(t.dtype.name in ("float16", "bfloat16") for t in op.outputs)]
        if not own:
            return ""
        return (", or be one of the %d node(s) the program itself computes in half (e.g. %r; its "
                "own casts), which are not probed and overflow in a float32 run too" % (len(own), own[0]))

    def _forget_heals(self, nodes: Optional[List[str]] = None) -> str:
        """Forgets this session's heals (``nodes`` of them) for later sessions of the process
        (heal_memory.py), now that its steps fail with them too; what a line saying so adds
        of the heal file."""
        nodes = [n for heal in self.heals for n in heal.nodes] if nodes is None else nodes
        forget_healed(self.shadow.user_graph, nodes)
        self._heals_forgotten = True
        self._forgotten = list(nodes)
        return " (the heal file %s still lists them)" % self.heal_file if self.heal_file else ""

    @property
    def forgotten(self) -> List[str]:
        """The nodes of this session's heals taken back for later sessions (none if kept)."""
        return list(self._forgotten)

    def session_closed(self) -> None:
        """At the session's close: heals whose session ends failing again with no half node
        left (its last step skipped on an inf/nan loss, not the first since the last heal)
        are taken back for later sessions, said once.  A sweep's trial whose learning rate diverges in
        float32 too heals node after node until none is half, and may close before the
        verdict that says so; the next trials would otherwise start with its heals float32
        for nothing.  Steps skipped on a finite loss after a heal are the restarted scale
        falling again, and keep them."""
        applied, skipped = self._since_heal
        if not self.heals or self._heals_forgotten or not self._last_failed or skipped < _FAILING_AGAIN:
            return
        if self.shadow.reports[-1].nodes_converted:
            return  # half nodes are left: the failure may still be theirs (t-SNE's cancellation)
        # a fed or read input past half's range (a raw income of 6.8e5) is the data's, whatever
        # the learning rate: those heals stay
        nodes = [n for heal in self.heals if heal.op not in _INPUT_OPS for n in heal.nodes]
        if not nodes:
            return
        hint = self._forget_heals(nodes)
        _logger.warning(
            "tfamp_rewrite: this session closed with its loss inf/nan again after its last heal "
            "(%d step(s) skipped on it, %d applied since), with no node left in %s: its "
            "heal(s) of computed values did not keep its steps finite, so most likely they "
            "fail in float32 too (a learning rate that diverges), and later sessions of this "
            "process start without them (%s)%s" % (
                skipped, applied, self.shadow.dtype, _some(nodes, 4), hint))

    def _write_heal_file(self) -> None:
        """Writes the kept nodes and the heals to ``heal_file`` (doctor/heal_files.py)."""
        if not self.heal_file:
            return
        try:
            write_heal_file(self.heal_file, self.shadow.kept_float32, [asdict(h) for h in self.heals])
        except OSError as error:
            _logger.warning("tfamp_rewrite: cannot write %s=%s (%s); the heals stay in this session"
                            % (HEAL_FILE_ENV, self.heal_file, error.strerror))


def _nonfinite_feeds(feeds) -> List[str]:
    """The names of the floating tensors in ``feeds`` (a run's feed dict) fed inf or nan; a
    sparse feed is named by its values tensor."""
    names = []
    for key, value in (feeds or {}).items():
        if hasattr(key, "dense_shape"):  # a SparseTensor, fed a SparseTensorValue or a triple
            key, value = key.values, value.values if hasattr(value, "values") else value[1]
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):  # not one array (a ragged list): TensorFlow rejects it
            continue
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            names.append(getattr(key, "name", str(key)))
    return names


_collectives: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> (version, answer)


def _runs_collectives(graph) -> bool:
    """True if ``graph`` holds Horovod's collective ops: every rank must run the same graph.
    Looked up once per graph version: a scan of thousands of ops per step shows in step time."""
    known = _collectives.get(graph)
    if known is None or known[0] != graph.version:
        known = _collectives[graph] = (graph.version, any(
            op.type.startswith("Horovod") for op in graph.get_operations()))
    return known[1]


MOST_CULPRITS_SAID = 4  # a warning names this many culprits, then counts the others


def _finding_message(finding: Finding, twins: List[str], which: str, trajectory: str, dtype: str,
                     then: str) -> str:
    culprits = finding.culprits
    nodes_to_exclude = finding.fix.nodes_to_exclude + ["^%s$" % re.escape(t) for t in twins]
    if len(culprits) == 1 and culprits[0].presumed:  # a float32 op's or a loop's inf/nan
        cause = "%s, which is inf/nan whatever the loss scale. Keep it" % _culprit_said(culprits[0])
    elif len(culprits) == 1:
        cause = "%s, which does not fit %s whatever the loss scale. Keep it" % (
            _culprit_said(culprits[0]), dtype)
    else:
        said = "; ".join(_culprit_said(c) for c in culprits[:MOST_CULPRITS_SAID])
        if len(culprits) > MOST_CULPRITS_SAID:
            said += "; and %d more" % (len(culprits) - MOST_CULPRITS_SAID)
        cause = ("%d tensors that do not fit %s whatever the loss scale, none computed from "
                 "another's inf/nan: %s. Keep them" % (len(culprits), dtype, said))
    return ("tfamp_rewrite: training steps%s are being skipped: loss scale %s. The cause is %s "
            "float32: these nodes alone with %s, every node of their op types with %s; %s." % (
                which, trajectory, cause, nodes_to_exclude_setting(nodes_to_exclude), finding.fix.env, then))


def _whose_steps(signal, several: bool, steps: str = "those") -> str:
    """Where ``several`` loss-scaled steps (optimizers, each its own loss scale) share a graph:
    " (those updating 'b/kernel' and 1 more variable)", to say which one a line is about."""
    if not several or not signal.variables:
        return ""
    more = len(signal.variables) - 1
    others = " and %d more variable%s" % (more, "s" if more > 1 else "") if more else ""
    return " (%s updating '%s'%s)" % (steps, signal.variables[0], others)


def _culprit_said(culprit: Culprit) -> str:
    largest = "inf/nan" if culprit.max_abs == float("inf") else "%.4g" % culprit.max_abs
    role = "forward value" if culprit.role == "forward" else culprit.role.replace("_", " ")
    return "%s%s (%s %r, largest |x| %s)" % (
        "presumably " if culprit.presumed else "", culprit.held_by, role, culprit.tensor, largest)


def _some(names: List[str], most: int = 12) -> str:
    """``names`` quoted, the first ``most`` of them, then how many more."""
    said = ", ".join(repr(n) for n in names[:most])
    return said if len(names) <= most else "%s and %d more" % (said, len(names) - most)


def _is_dynamic(loss_scale) -> bool:
    return hasattr(loss_scale, "min_loss_scale")


def _op_of(element):
    return getattr(element, "op", element)


def private_step_op(shadow, signal):
    """The private graph's op of ``signal``'s step that a run computing the step computes."""
    return _op_of(shadow.private_fetch(signal.computed_by or signal.all_finite))


def _flag_and_scale(signal) -> tuple:
    """The tensors a run fetches to watch ``signal``'s step: its own, or as passed out of the
    user's TF1 conds (StepSignal.exported)."""
    return signal.exported or (signal.all_finite, signal.scale)


def _loss_flag(signal, graph) -> tuple:
    """``(signal.loss_finite,)`` where a run can fetch it with the step's flag, else ``()``."""
    flag = signal.loss_finite
    return (flag,) if flag is not None and graph.is_fetchable(flag) else ()


def _increment_period(signal) -> str:
    """How many finite steps in a row ``signal``'s loss scale grows after, as said."""
    period = getattr(signal.loss_scale, "increment_period", None)
    return "%d" % period if period else "a run of"


def steps_that_ran(step_values) -> dict:
    """``{index: (flag, scale)}`` of the steps that ran: a step in a TF1 cond branch not taken
    this run reads NOT_RUN (a scale is never below 1)."""
    return {i: (values[0], values[1]) for i, values in step_values.items() if float(values[1]) > 0}


def _losses_not_finite(step_values) -> set:
    """The indices of the steps that ran whose loss was fetched and held inf/nan."""
    return {i for i, values in step_values.items()
            if float(values[1]) > 0 and len(values) > 2 and not bool(values[2])}


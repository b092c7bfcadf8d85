"""``tfamp_rewrite.Session``: a drop-in ``tf.compat.v1.Session`` running the mixed-precision graph.

The user's ``tf.Graph`` is never changed.  The session runs a ``ShadowGraph`` -- the
rewritten copy, imported into a private graph and kept in step as the user graph grows
-- and maps what ``run`` is given onto it by name: fetches (tensors, operations, names,
nested lists/tuples/dicts, SparseTensor, IndexedSlices), feeds, ``make_callable``,
``partial_run``.  Fetched values come back in the user graph's dtypes.  To everything
else (``sess.graph``, ``Tensor.eval()``, ``Operation.run()``, ``as_default()``, savers,
hooks) it is the user's session: ``sess.graph`` is the user graph.

TensorFlow's own AMP rewrite is switched off in the config the session passes on, so
nothing is rewritten twice.  A config that switches it off itself
(``rewrite_options.auto_mixed_precision = OFF``) keeps that session float32, as it does
for TensorFlow's pass and NVIDIA's variables, and that is said once.  Without a GPU of
compute capability >= 7.0 (8.0 for bfloat16) the session runs the user graph unchanged
and logs once why -- unless the rewrite target is ``cpu`` (``TFAMP_REWRITE_TARGET=cpu`` or
``set_rewrite_target``).  A session on a server (a non-empty target) uses stock TensorFlow
ops only, as its tasks may run in processes that never loaded the op library.
The dtype is ``Session(dtype=...)``, else ``TFAMP_REWRITE_DTYPE``, else float16; half
nodes run half kernels unless ``Session(numerics="emulate")`` or
``TFAMP_REWRITE_NUMERICS=emulate`` asks for float32 kernels on values rounded to half.
Whose pass it follows is ``Session(compat=...)``, else ``TFAMP_REWRITE_COMPAT``, else
``auto``: the running TensorFlow's (graph_rewrite/compat.py).  Each rewrite logs one INFO
line naming what it converted and these settings.  ``Session(nodes_to_exclude=[...])``, else
``TFAMP_REWRITE_NODES_TO_EXCLUDE`` (comma-separated), keeps the nodes those regular
expressions match from the start of their names float32, as the log lines' fixes give them.
"""
from __future__ import annotations

import os
import threading
from dataclasses import asdict
from typing import List, NamedTuple, Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.util import nest

from ..doctor.limits import limits_for
from ..graph_rewrite.compat import session_compat
from ..tf_compat import config_without_tf_amp
from . import step_watch
from .checkpoint_heals import (
    SAVE,
    CheckpointRuns,
    heals_beside,
    kept_beside,
    save_beside,
    say_loss_scale_left_out,
)
from .checkpoint_restore import restore_feeds
from .deferred_checks import DeferredChecks
from .devices import (
    log_once,
    session_dtype,
    session_nodes_to_exclude,
    session_numerics,
    session_rewrite_target,
)
from .heal_memory import HEAL_FILE_ENV, healed_in_this_process, read_heal_file, remember_healed
from .inference_watch import InferenceWatch
from .late_loss_scales import LateLossScales
from .op_walks import ancestors
from .precision_monitor import DEFAULT_DIR, MONITOR_DIR_ENV, PrecisionMonitor, monitor_every
from .run_plans import ORIGIN
from .shadow_graph import ShadowGraph, fetch_elements, has_operation, map_fetch_structure
from .step_signals import loss_scale_variables, step_signals
from .step_watch import StepWatch, auto_fix_setting
from .unscaled_training import UnscaledTrainingWatch
from .user_errors import in_user_terms

_tf1 = tf.compat.v1
# TensorFlow's own classes, captured before anything can replace them (see activation.py).
TF_SESSION_CLASSES = {"Session": _tf1.Session, "InteractiveSession": _tf1.InteractiveSession}


class _RewritingSession:
    """Mixin over a TensorFlow session class; see the module docstring."""

    def __init__(self, target="", graph=None, config=None, dtype=None, numerics=None, compat=None,
                 auto_fix=None, nodes_to_exclude=None):
        # TensorFlow's __del__ reads _session; a bad argument raises below before
        # BaseSession.__init__ would set it.
        self._session = None
        self._user_graph = graph if graph is not None else _tf1.get_default_graph()
        self._inner = threading.local()
        self._unscaled = UnscaledTrainingWatch()
        self._shadow = self._make_shadow(session_dtype(dtype), session_numerics(numerics),
                                         session_compat(compat), config, target)
        if self._shadow is not None:
            self._shadow.excluded_by_name = session_nodes_to_exclude(nodes_to_exclude)
        self._watch = self._make_watch(auto_fix_setting(auto_fix))
        self._checks = DeferredChecks(self._shadow) if self._shadow is not None else None
        self._late_scales = LateLossScales(self._user_graph, self._shadow)
        self._checkpoints = CheckpointRuns()
        self._restored_heals: List[dict] = []  # heal records beside the checkpoints it restored
        self._mapped_runs = {}  # _run_key -> (shadow generation, _MappedRun)
        heals = self._watch is not None and self._watch.auto_fix
        self._inference = InferenceWatch(self._shadow, heals) if self._shadow is not None else None
        run_graph = self._shadow.graph if self._shadow is not None else self._user_graph
        super().__init__(target, graph=run_graph, config=config_without_tf_amp(config))

    def _make_shadow(self, dtype: str, numerics: str, compat: str, config, target):
        """The ShadowGraph this session runs, or None (the user graph runs unchanged)."""
        if config is not None and config.graph_options.rewrite_options.auto_mixed_precision == \
                rewriter_config_pb2.RewriterConfig.OFF:
            log_once("tfamp_rewrite: a session's config sets graph_options.rewrite_options."
                     "auto_mixed_precision to OFF, so that session runs its graph unchanged, in "
                     "float32, as TensorFlow's own pass would (loss scaling, if on, stays)")
            return None
        rewrite_target, why = session_rewrite_target(dtype)
        if not rewrite_target:
            log_once("tfamp_rewrite: " + why)
            return None
        return ShadowGraph(self._user_graph, rewrite_target, dtype, numerics, compat,
                           session_target=target.decode() if isinstance(target, bytes) else target)

    def _make_watch(self, auto_fix: bool):
        """The StepWatch over this session's loss-scaled steps (None when not rewriting)."""
        if self._shadow is None:
            return None
        kept = read_heal_file()
        if kept:
            present = [n for n in kept if has_operation(self._user_graph, n)]
            log_once("tfamp_rewrite: %s=%s lists %d node(s) to keep float32; %s" % (
                HEAL_FILE_ENV, os.environ.get(HEAL_FILE_ENV), len(kept),
                "this graph holds %d of them (e.g. '%s')" % (len(present), present[0]) if present
                else "this graph holds none of them (yet: nodes added later are kept too)"))
        healed = [n for n in healed_in_this_process(self._user_graph) if n not in kept]
        if healed:  # once per set of nodes: an Estimator's every session carries the same
            log_once("tfamp_rewrite: sessions made after a heal keep the healed nodes their graph "
                     "holds float32 from their first run (an Estimator's evaluation and next "
                     "train() too, and the next trial of a sweep): this one keeps %d (%s) (said "
                     "once per set of nodes)" % (len(healed), ", ".join(repr(n) for n in sorted(healed)[:4])
                                + (", ..." if len(healed) > 4 else "")),
                     key="carried heals %s" % sorted(healed))
        self._shadow.kept_float32.update(kept + healed)
        every = monitor_every()
        monitor = (PrecisionMonitor(every, os.environ.get(MONITOR_DIR_ENV) or DEFAULT_DIR,
                                    limits_for(self._shadow.dtype)) if every else None)
        return StepWatch(self._shadow, auto_fix, heal_file=os.environ.get(HEAL_FILE_ENV) or None,
                         monitor=monitor, run_private=self._run_private)

    def close(self):
        if self._watch is not None:
            self._watch.session_closed()
            if self._watch.monitor is not None:
                self._watch.monitor.close()
        if self._inference is not None:
            self._inference.search.session_closed()
        super().close()

    @property
    def heals(self):
        """The heals this session made (``step_watch.Heal``; empty when none or not rewriting)."""
        return list(self._watch.heals) if self._watch is not None else []

    # -- what the rest of TensorFlow sees -------------------------------------------
    @property
    def graph(self):
        """The user's graph -- except inside the base class's own run machinery."""
        if self._shadow is not None and getattr(self._inner, "active", False):
            return self._shadow.graph
        return self._user_graph

    @property
    def graph_def(self):
        return self._user_graph.as_graph_def()

    @property
    def rewrite_reports(self):
        """The reports of the rewrites this session imported: the first and the latest
        (at most 16; empty when not rewriting)."""
        return list(self._shadow.reports) if self._shadow is not None else []

    def _call_base(self, method, *args):
        """Calls the base class's ``method`` while ``self.graph`` is the private graph; an
        op's error is raised of the user's op (user_errors.py)."""
        inner = self._inner
        previous = getattr(inner, "active", False)
        inner.active = True
        try:
            return method(*args)
        except tf.errors.OpError as error:
            user_error = None if self._shadow is None else in_user_terms(
                error, self._user_graph, self._shadow.user_name)
            if user_error is None:
                raise
        finally:
            inner.active = previous
        raise user_error  # out of the handler, so that it reads as TensorFlow's own

    def _sync(self) -> None:
        """Brings the private graph up to date, and what the unscaled-training watch knows."""
        self._shadow.sync()
        self._unscaled.graph_changed(self._user_graph, self._shadow.dtype, self._shadow.converted_now,
                                     self._shadow.unguarded_writes, self._shadow.guarded_writes)

    def _mapped_run(self, fetches, feed_dict) -> "_MappedRun":
        """What ``fetches`` and ``feed_dict``'s keys map to, memoised for a run that repeats
        them (the same leaf, or list or tuple of leaves, and the same keys) -- the common
        case, where a run's Python work is all its overhead."""
        key = _run_key(fetches, feed_dict)
        generation = self._shadow.generation
        try:
            found = self._mapped_runs.get(key) if key is not None else None
        except TypeError:  # an unhashable leaf (a function graph's tensor): TensorFlow says why below
            key = found = None
        if found is not None and found[0] == generation:
            return found[1]
        mapped = self._map_fetches(fetches)
        feed_keys = None
        if feed_dict and not any(isinstance(k, (tuple, list)) for k in feed_dict):
            feed_keys = self._shadow.private_feeds(list(feed_dict))
        fed = _fed_tensors(feed_keys if feed_keys is not None else self._map_feeds(feed_dict))
        entry = _MappedRun(mapped, fetch_elements(mapped), feed_keys, fed,
                           any(t.dtype == tf.string for t in fed))
        if key is not None:
            if len(self._mapped_runs) >= _MAPPED_RUNS_KEPT:
                self._mapped_runs.clear()
            self._mapped_runs[key] = (generation, entry)
        return entry

    def _fed_values(self, mapped_run: "_MappedRun", feed_dict):
        """``feed_dict`` on the private graph (``_map_feeds``), by ``mapped_run``'s keys."""
        if mapped_run.feed_keys is None:
            return self._map_feeds(feed_dict)
        fed_value = self._shadow.fed_value
        return {private: fed_value(private, value)
                for private, value in zip(mapped_run.feed_keys, feed_dict.values())}

    def _map_fetches(self, fetches):
        return map_fetch_structure(fetches, self._shadow.private_fetch)

    def _map_feeds(self, feed_dict):
        """``feed_dict`` on the private graph, keys flattened as ``Session.run`` flattens them.

        A key may be a nested structure (a tuple, namedtuple such as ``LSTMStateTuple``, or
        tuples of those) fed with a value of the same structure; TensorFlow's own
        ``flatten_dict_items`` pairs them up, so mismatches fail exactly as they would there.
        """
        if not feed_dict:
            return feed_dict
        items = list(nest.flatten_dict_items(feed_dict).items())
        privates = self._shadow.private_feeds([key for key, _ in items])
        return {private: self._shadow.fed_value(private, value)
                for private, (_, value) in zip(privates, items)}

    def _map_feed_list(self, feeds):
        """``partial_run_setup``'s feeds: one feed key or a list/tuple of them."""
        if isinstance(feeds, (list, tuple)):
            return self._shadow.private_feeds(feeds)
        return self._shadow.private_feed(feeds)

    # -- running ----------------------------------------------------------------------
    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        try:
            return self._run_rewritten(fetches, feed_dict, options, run_metadata)
        except tf.errors.NotFoundError:
            # A float32 checkpoint restored into a loss-scaled program (checkpoint_restore.py).
            feeds = restore_feeds(self._user_graph, fetches,
                                  lambda tensors: self._run_rewritten(tensors, feed_dict))
            if feeds is None:
                raise
        return self._run_rewritten(fetches, {**(feed_dict or {}), **feeds}, options, run_metadata)

    def _run_rewritten(self, fetches, feed_dict=None, options=None, run_metadata=None):
        if self._shadow is None:
            return super().run(fetches, feed_dict, options, run_metadata)
        if self._user_graph.version == 0:  # TensorFlow's check, before fetches are looked up
            raise RuntimeError("The Session graph is empty. Add operations to the graph before "
                               "calling run().")
        self._sync()
        run = self._mapped_run(fetches, feed_dict)
        mapped, elements, fed = run.fetches, run.elements, run.fed
        feeds = self._fed_values(run, feed_dict)
        self._unscaled.before_run(elements)
        self._late_scales.before_run(elements, self._run_private)  # late_loss_scales.py
        steps_before = step_watch.step_runs_so_far()  # a run with unwatched steps counts at once
        watched = None if self._watch is None else self._watch.extra_fetches(elements, fed)
        checks = self._checks.fetches(elements, fed)
        steps_unseen = watched is None and step_watch.step_runs_so_far() > steps_before
        guard_off = self._shadow.state_guard_off() if watched is None and not steps_unseen else None
        if guard_off is not None:  # no step to skip: state stores what float32 stores
            feeds = {**(feeds or {}), guard_off: True}
        infers = watched is None and not steps_unseen and not self._left_to_the_loss_scale(elements, fed)
        if watched is None:  # a run that infers: its hidden inf/nan checks, or the origin search
            hidden = self._inference.hidden_fetches(elements, fed) if infers else None
        else:  # a training run: what its forward pass hides, or the origin search
            hidden = self._inference.step_run_fetches(elements, fed)
        checkpoint = self._checkpoints.checkpoint_run(elements, feeds) if run.fed_strings else None
        if watched is None and checks is None and hidden is None:
            values = self._run_base(mapped, feeds, options, run_metadata, elements, fed)
            self._judge_run(None, None, steps_before, fetches, values, infers=infers)
            if checkpoint is not None:
                self._carry_heals(*checkpoint, elements)
            return values
        extra, probe_ids = watched if watched is not None else ({}, ())
        if checks is not None:
            extra = dict(extra, checks=checks[1])
        if hidden is not None:
            extra = dict(extra, hidden=hidden.statuses)
        values, extra_values = self._run_base((mapped, extra), feeds, options, run_metadata,
                                              elements, fed)
        if watched is not None:
            self._watch_steps(extra_values, probe_ids, feeds)
        self._judge_run(checks, extra_values.get("checks"), steps_before, fetches, values,
                        hidden, extra_values.get("hidden"), extra_values.get("steps"), infers)
        if checkpoint is not None:
            self._carry_heals(*checkpoint, elements)
        return values

    def _watch_steps(self, extra_values, probe_ids=(), feeds=None) -> None:
        """The step watch's look at a run's steps (StepWatch.after_run); a heal it makes of
        the node an origin search looks for ends that search (OriginSearch.healed_by_a_step)."""
        heals_before = len(self._watch.heals)
        self._watch.after_run(extra_values, probe_ids, self._run_private, feeds)
        self._inference.search.healed_by_a_step(
            [n for heal in self._watch.heals[heals_before:] for n in heal.nodes])

    def _left_to_the_loss_scale(self, elements, fed) -> bool:
        """Whether a run of no step accumulating loss-scaled gradients
        (``InferenceWatch.adds_scaled_gradients``) is left to the step that applies them: its
        inf/nan skips that step and lowers the scale -- while the scale may still recover;
        after that (a float16 overflow in the accumulated runs, which the applying step's
        probes cannot see) the inference watch looks for its origin."""
        return (self._watch is not None and self._inference.adds_scaled_gradients(elements, fed)
                and self._watch.scale_may_recover())

    def _carry_heals(self, kind: str, prefix: str, elements=()) -> None:
        """After a Saver's run: a save writes the nodes kept float32 beside the checkpoint
        ``prefix``; a restore keeps float32 those listed beside it (checkpoint_heals.py)."""
        if kind == SAVE:
            # not the heals taken back (steps that failed in float32 too)
            kept = self._shadow.kept_float32 - set(self._watch.forgotten if self._watch else ())
            save_beside(prefix, kept, self._restored_heals + [asdict(h) for h in self.heals],
                        {name: self._user_graph.get_operation_by_name(name).type
                         for name in kept if has_operation(self._user_graph, name)})
            say_loss_scale_left_out(elements, [v.op.name for v in loss_scale_variables(
                step_signals(self._user_graph))])
            return
        self._late_scales.after_restore(self._run_private)
        restores = [self._shadow.user_name(getattr(e, "name", "")) for e in elements]
        carried = [n for n in kept_beside(prefix, self._user_graph, restores, self._shadow.kept_float32)
                   if n not in self._shadow.kept_float32]
        if carried:
            self._shadow.heal(carried)
            remember_healed(self._user_graph, carried)
            # the heals that kept them, written again beside this session's checkpoints
            self._restored_heals += [h for h in heals_beside(prefix) if h not in self._restored_heals]

    def _run_base(self, fetches, feeds, options, run_metadata, elements, fed):
        """TensorFlow's run of private-graph ``fetches`` (``elements``, fed ``fed``); an
        assertion it fails below a half node is said (InferenceWatch.after_failure), and the
        error raised as it is."""
        try:
            return self._call_base(super().run, fetches, feeds, options, run_metadata)
        except tf.errors.InvalidArgumentError as error:
            found = self._inference.after_failure(error, elements, fed)
            if found is not None and self._watch is not None:
                self._heal_origin(found, "a run failing an assertion again below half nodes")
            raise

    def _judge_run(self, checks, statuses, steps_before: int, fetches, values, hidden=None,
                   hidden_statuses=None, steps=None, infers: bool = True) -> None:
        """After a run and its step watch: the deferred checks' verdict (``checks``: what
        ``DeferredChecks.fetches`` planned, ``statuses`` their values), then the inference
        watch's (``hidden``: what it planned): for a run that computed no loss-scaled step,
        and for one whose watched ``steps`` (``{i: (finite, scale)}``) applied but returned
        or hid inf/nan, whose origin, once found, is healed (a NanTensorHook waits meanwhile).
        ``infers``: False for a run of no step that accumulates loss-scaled gradients
        (``InferenceWatch.adds_scaled_gradients``), which the inference watch leaves alone."""
        self._late_scales.ran()
        if checks is not None:
            skipped = step_watch.skipped_while_recovering_since(self._user_graph, steps_before)
            try:
                self._checks.after_run(checks[0], statuses, skipped)
            except tf.errors.InvalidArgumentError as error:
                if step_watch.step_runs_so_far() == steps_before:  # an evaluation's, as if not deferred
                    self._inference.after_failure(error, [self._shadow.private_fetch(error.op)])
                raise
        if step_watch.step_runs_so_far() == steps_before:
            if not infers:
                return
            found = self._inference.after_run(fetches, values, hidden, hidden_statuses)
            if found is not None and self._watch is not None:
                self._heal_origin(found, "an inference run's inf/nan, traced to its node")
            if self._watch is not None and self._watch.can_heal() and (
                    found is not None or self._inference.traces(fetches, values)):
                # a NanTensorHook (MonitoredSession runs it on every run) waits on a NaN
                # loss that an evaluation before training returned, as on a skipped step's
                step_watch.traced_run(self._user_graph)
            return
        ran = step_watch.steps_that_ran(steps or {})
        if not ran:  # none, or each in a TF1 cond branch not taken
            return
        applied = all(bool(finite) for finite, _ in ran.values())
        was_searching = self._inference.looking_for_origin()
        found = self._inference.after_step_run(fetches, values, applied, hidden, hidden_statuses)
        if found is not None:
            self._heal_origin(found, "no step skipped: an inf/nan with finite gradients" if applied
                              else "an inf/nan a run returned, traced to its node on a skipped step",
                              restart_scale=not applied)
        # a NanTensorHook waits on a run that starts a search or takes part in one, not on
        # one that never computes what the search looks for
        searching = self._inference.looking_for_origin() and (
            not was_searching or (hidden is not None and hidden.kind == ORIGIN))
        if (found is not None or searching) and self._watch.can_heal():
            step_watch.still_recovering(self._user_graph)

    def _heal_origin(self, found, why: str, restart_scale: bool = False) -> None:
        """Heals where an origin search ``found`` an inf/nan to start: ``(origin, nodes to
        keep float32)`` (StepWatch.heal_origin)."""
        origin, keep = found
        search = self._inference.search
        if self._watch.heal_origin(keep, origin.tensor, origin.op, why, search.list_edit(keep),
                                   self._run_private if restart_scale else None):
            search.healed()

    def _run_private(self, fetches):
        """Runs private-graph ``fetches`` with no feeds (the step watch's own runs)."""
        return self._call_base(super().run, fetches)

    def partial_run_setup(self, fetches, feeds=None):
        if self._shadow is None:
            return super().partial_run_setup(fetches, feeds)
        self._sync()
        feeds = None if feeds is None else self._map_feed_list(feeds)
        mapped = self._map_fetches(fetches)
        fed = [] if feeds is None else feeds if isinstance(feeds, list) else [feeds]
        fed_tensors = [t for t in fed if isinstance(t, tf.Tensor)]
        self._checks.say_unchecked_in_partial_runs(fetch_elements(mapped), fed_tensors)
        if self._watch is not None:
            self._watch.say_unwatched_in_partial_runs(fetch_elements(mapped), fed_tensors)
        return self._call_base(super().partial_run_setup, mapped, feeds)

    def partial_run(self, handle, fetches, feed_dict=None):
        if self._shadow is None:
            return super().partial_run(handle, fetches, feed_dict)
        return self._call_base(super().partial_run, handle, self._map_fetches(fetches),
                               self._map_feeds(feed_dict))

    def make_callable(self, fetches, feed_list=None, accept_options=False):
        if self._shadow is None or feed_list is not None:
            # With a feed list TensorFlow's callable calls self.run(fetches, {key: value}),
            # which maps both (nested keys included) and keeps up with a growing graph.
            return super().make_callable(fetches, feed_list, accept_options)
        # Without one, TensorFlow's callable runs the graph directly: its loss-scaled steps
        # went unwatched, and it kept running the graph it was made on after a heal.  Each
        # call is a run, as with a feed list -- but for fetches that compute nothing in half
        # and no loss-scaled step (a queue runner's enqueue, made once per example: a run's
        # watch made queue-fed training 4-5x slower), which TensorFlow's callable runs, made
        # again after a heal.
        self._sync()
        mapped = self._map_fetches(fetches)  # TensorFlow's errors for what it refuses, when made
        if self._nothing_to_watch(fetch_elements(mapped)):
            return self._direct_callable(fetches, accept_options)

        def call(options=None, run_metadata=None):
            return self.run(fetches, options=options, run_metadata=run_metadata)

        if accept_options:
            return call
        return lambda: call()

    def _nothing_to_watch(self, elements) -> bool:
        """Whether a run of private ``elements`` computes no half node and no loss-scaled step:
        nothing of it is watched, checked or healed."""
        upstream = ancestors(elements)
        if any(self._shadow.computes_in_half(op) for op in upstream):
            return False
        return not any(step_watch.private_step_op(self._shadow, signal) in upstream
                       for signal in step_signals(self._user_graph))

    def _direct_callable(self, fetches, accept_options: bool):
        """TensorFlow's callable of ``fetches`` in the private graph, made again when a heal
        imported a new generation of it."""
        made = {}

        def call(*args, **kwargs):
            if made.get("generation") != self._shadow.generation:
                made["generation"] = self._shadow.generation
                made["call"] = super(_RewritingSession, self).make_callable(
                    self._map_fetches(fetches), None, accept_options)
            return made["call"](*args, **kwargs)
        return call

    def _make_callable_from_options(self, callable_options):
        """Keras' way to run in TF1 graph mode: ``callable_options`` names the user graph's
        feeds, fetches and targets; the callable runs their private twins, takes the user's
        values (rounded or cast where the twin is half) and returns values in the user's
        dtypes.  Its loss-scaled steps are watched as a run's are: a step due a diagnosis,
        and a call while the origin of an inf/nan is looked for, is made through ``run``
        (which fetches the probes or statuses it computes, and may heal), and after a heal
        the callable is made again on the healed graph."""
        if self._shadow is None:
            return super()._make_callable_from_options(callable_options)
        made = {}

        def make():
            made["generation"] = self._shadow.private_name("")
            made["call"], made["steps"] = self._private_callable(callable_options)

        make()

        def call(*values, **kwargs):
            if made["generation"] != self._shadow.private_name(""):  # healed since
                make()
            if not callable_options.tensor_connection and (
                    self._inference.looking_for_origin()
                    or (made["steps"] and self._watch.diagnosis_due(made["steps"]))):
                return self._run_as_callable(callable_options, values, kwargs)
            return made["call"](*values, **kwargs)

        return call

    def _run_as_callable(self, callable_options, values, kwargs):
        """One call of the callable ``callable_options`` describes, made through ``run``."""
        fetches = list(callable_options.fetch)
        options = callable_options.run_options if callable_options.HasField("run_options") else None
        results = self.run(fetches + list(callable_options.target),
                           dict(zip(callable_options.feed, values)), options,
                           kwargs.get("run_metadata"))
        return results[:len(fetches)]

    def _private_callable(self, callable_options):
        """``(callable, its loss-scaled steps)``: TensorFlow's callable of the private twins
        of ``callable_options``' feeds, fetches and targets, with the step watch's, deferred
        checks' and hidden inf/nan checks' fetches added and judged after each call."""
        self._sync()
        shadow = self._shadow
        user_feeds = [self._user_graph.as_graph_element(name) for name in callable_options.feed]
        feeds = shadow.private_feeds(user_feeds)
        fetches = [shadow.private_fetch(name) for name in callable_options.fetch]
        targets = [shadow.private_fetch(name) for name in callable_options.target]
        self._unscaled.before_run(fetches + targets)
        self._late_scales.before_run(fetches + targets, self._run_private)
        fed = [t for t in feeds if isinstance(t, tf.Tensor)]
        steps = None if self._watch is None else self._watch.step_fetches(fetches + targets, fed)
        step_tensors = nest.flatten(steps) if steps else []
        checks = self._checks.fetches(fetches + targets, fed)
        check_tensors = list(checks[1]) if checks else []
        watch = self._inference
        infers = steps is not None or not self._left_to_the_loss_scale(fetches + targets, fed)
        hidden = None
        if infers:
            hidden = (watch.step_hidden_plan if steps else watch.hidden_plan)(fetches + targets, fed)
        check_due = watch.step_check_due if steps else watch.check_due
        kind = object()  # this callable's runs are one kind (InferenceWatch.check_due)
        mapped = config_pb2.CallableOptions()
        mapped.CopyFrom(callable_options)
        _replace(mapped.feed, [t.name for t in feeds])
        _replace(mapped.fetch, [t.name for t in fetches + step_tensors + check_tensors])
        _replace(mapped.target, [op.name for op in targets])
        for connection in mapped.tensor_connection:
            connection.from_tensor = shadow.private_fetch(connection.from_tensor).name
            connection.to_tensor = shadow.private_feed(connection.to_tensor).name
        run = checked_run = self._call_base(super()._make_callable_from_options, mapped)
        if hidden:  # a second callable that also fetches the hidden inf/nan checks
            mapped.fetch.append(hidden.statuses.name)
            checked_run = self._call_base(super()._make_callable_from_options, mapped)
        conversions = [(feed, feed.dtype.as_numpy_dtype if feed.dtype != user.dtype else None)
                       for feed, user in zip(feeds, user_feeds)]

        def run_private(*values, **kwargs):
            values = [shadow.fed_value(feed, value if dtype is None else np.asarray(value, dtype))
                      for (feed, dtype), value in zip(conversions, values)]
            steps_before = step_watch.step_runs_so_far()
            checked = hidden is not None and check_due(kind)
            results = (checked_run if checked else run)(*values, **kwargs)
            step_values = None
            if steps:
                step_values = nest.pack_sequence_as(
                    steps, list(results[len(fetches):len(fetches) + len(step_tensors)]))
                self._watch_steps({"steps": step_values})
            after_steps = len(fetches) + len(step_tensors)
            check_values = results[after_steps:after_steps + len(check_tensors)]
            self._judge_run(checks, check_values if checks else None, steps_before,
                            list(callable_options.fetch), list(results[:len(fetches)]),
                            hidden, results[-1] if checked else None, step_values, infers)
            return results[:len(fetches)]

        return run_private, list(steps or ())


def _replace(repeated_field, values) -> None:
    del repeated_field[:]
    repeated_field.extend(values)


class _MappedRun(NamedTuple):
    """A run's fetches and feed keys on the private graph."""
    fetches: object                 # the mapped fetch structure
    elements: list                  # its tensors and operations
    feed_keys: Optional[List]       # the private feed keys in feed_dict's order; None: nested keys
    fed: list                       # the fed tensors
    fed_strings: bool               # whether a string is fed (a Saver's checkpoint prefix may be)


_MAPPED_RUNS_KEPT = 256  # a program fetching new things every run does not grow the memo
_FETCH_LEAVES = (str, tf.Tensor, tf.Operation)


def _run_key(fetches, feed_dict):
    """A hashable key for a run of ``fetches`` fed ``feed_dict``: None unless the fetches
    are one leaf or a plain list or tuple of them."""
    if isinstance(fetches, _FETCH_LEAVES):
        fetch_key = fetches
    elif type(fetches) in (list, tuple) and all(isinstance(f, _FETCH_LEAVES) for f in fetches):
        fetch_key = (type(fetches),) + tuple(fetches)
    else:
        return None
    return fetch_key, tuple(feed_dict) if feed_dict else ()


def _fed_tensors(feeds):
    return [key for key in (feeds or {}) if isinstance(key, tf.Tensor)]


class Session(_RewritingSession, TF_SESSION_CLASSES["Session"]):
    """Drop-in ``tf.compat.v1.Session`` that runs the mixed-precision rewrite of its graph."""


class InteractiveSession(_RewritingSession, TF_SESSION_CLASSES["InteractiveSession"]):
    """Drop-in ``tf.compat.v1.InteractiveSession`` that runs the mixed-precision rewrite."""

    def __init__(self, target="", graph=None, config=None, **kwargs):
        super().__init__(target, graph, config, **kwargs)
        if self._shadow is not None:
            # TensorFlow's __init__ took the private graph for one the caller passed and made
            # it the default graph; what the user builds next belongs in theirs.
            self._default_graph.__exit__(None, None, None)
            self._explicit_graph = graph
            if graph is not None:
                self._default_graph = graph.as_default()
                self._default_graph.enforce_nesting = False
                self._default_graph.__enter__()

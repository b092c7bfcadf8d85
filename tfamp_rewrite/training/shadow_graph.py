"""The rewritten copy of a user's tf.Graph that a session runs, kept in step as it grows.

Grappler never changes the user's graph: it optimises a copy.  A ``ShadowGraph`` does the
same once per graph version instead of once per run: ``sync()`` imports the mixed-precision
rewrite of the user graph into a private ``tf.Graph``; nodes the user adds later are
rewritten and imported incrementally, the nodes already imported keeping their dtypes
(Casts reconcile the edges between the two).  Every node keeps its name, so variables,
savers and checkpoints are name-for-name those of the float32 graph.

``private_fetch`` / ``private_feed`` map what a user passes to ``Session.run`` (tensors,
operations, names, objects with ``_as_graph_element``, SparseTensor, IndexedSlices) to the
private graph; a fetched tensor whose dtype the rewrite changed is cast back, so fetched
values always come back in the user graph's dtypes.  With emulated numerics a fetched
output of an emulated node is its value rounded to half, as the GPU would return it; the
rounding runs as one ``RoundToHalf`` node per tensor where the op library loads and no GPU
is visible, else as emulation's Cast pairs (graph_rewrite/rounding.py; logged once).
"""
from __future__ import annotations

import collections
import collections.abc
import logging
import re
import threading
import time
import weakref
from typing import Dict, List, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from ..fused_op.fusable import MARKER_ATTR, fuse_unscale_groups
from ..fused_op.op import fused_op_available
from ..fused_op.round_to_half import round_to_half_available
from ..graph_rewrite.casts import CAST_SUFFIX, reconcile_dtypes
from ..graph_rewrite.compat import AUTO, resolve_compat
from ..graph_rewrite.graph_view import GraphView, parse_input
from ..graph_rewrite.op_lists import effective_lists
from ..graph_rewrite.report import RewriteReport
from ..graph_rewrite.rewrite import op_def_lookup, rewrite_graph_def
from ..graph_rewrite.rounding import is_emulation_node, use_rounding_op
from ..user_log import LOGGER_NAME, log_info
from .absolute_precision import PERIODIC, half_absolute_reads, say_absolute_reads
from .assertion_deferral import ASSERT_OP, defer_assertions, waits_for_the_loss_scaling
from .check_deferral import defer_checks, hold_checked_steps, hold_checked_writes
from .constants_past_half import ConstantsPastHalf
from .devices import NODES_TO_EXCLUDE_ENV, log_once
from .finite_histograms import filter_non_finite
from .generations import GENERATION_SCOPE, import_generation, state_sources
from .gradient_accumulation import gradient_accumulators
from .half_readers import half_readers
from .half_writes import STORE_OPS, half_written_variables, say_half_writes
from .op_walks import reachable
from .outside_references import detach as detach_outside_references
from .ref_reads import order_reads_after_writes
from .state_guard import guard_state_writes, variable_op, written_variable
from .step_signals import in_loss_scaled_apply, step_signals
from .unscaled_training import unguarded_writes
from .variable_check import state_variables

_FETCH_CAST_SCOPE = "tfamp_fetch_as_"
_CONSTANT_ROUNDS = 8  # rewrites keeping readers of constants past half's range float32, at most
_HELPER_SCOPE = "/tfamp_"  # nodes added beside a user node: "<node>/tfamp_finite_only/...", ...
STATE_GUARD_OFF = "tfamp_state_guard_off"  # state_guard.py's switch, fed in runs of no step
_SAID_SUMMARIES: Set[str] = set()  # rewrite summary lines this process logged at INFO
# user graph -> its imports logged by _synced, over all its sessions (an evaluation loop
# opening a Session per evaluation on a graph it grows each time)
_SYNCS_PER_GRAPH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_REPORTS_KEPT = 16  # the first rewrite's report and the latest ones
# what a deferred check (an Identity) and a deferred assertion (a StringFormat) run as
_DEFERRED_AS = {"Identity", "StringFormat"}
GROWTHS_SAID_AT = 20  # a graph that grew this often grows in the user's loop: said once


class ShadowGraph:
    """A private graph holding the rewrite of ``user_graph`` (see module docstring)."""

    def __init__(self, user_graph: tf.Graph, target: str, dtype: str = "float16",
                 numerics: str = "native", compat: str = AUTO, session_target: str = ""):
        self.user_graph = user_graph
        # A session on a server ("grpc://...") may place nodes in processes that never
        # loaded the op library: the private graph then uses stock TensorFlow ops only.
        self.session_target = session_target or ""
        self.graph = tf.Graph()
        # Runs build ops here lazily, from whatever thread calls Session.run (A3C workers,
        # a serving pool): each thread needs its own name-scope, colocation and
        # control-dependency stacks, which a TF1 graph shares between threads otherwise.
        self.graph.switch_to_thread_local()
        self.target = target
        self.dtype = dtype
        self.numerics = numerics
        self.compat = resolve_compat(compat, dtype)
        self._rounded: Dict[str, str] = {}  # emulated half output -> its rounded float32 twin
        self._emulated_half: set = set()     # nodes that emulation runs as half (float32 kernels)
        self._round_when_fed: set = set()    # private tensors whose fed values are rounded to half
        self.reports: List[RewriteReport] = []  # the first rewrite's and the latest ones'
        self.rewrites = 0                    # how many rewrites were imported (reports drops some)
        self.decisions: Dict[str, object] = {}  # user node -> its latest rewrite decision
        self._converted_ever: Set[str] = set()  # user nodes some rewrite converted
        self.kept_float32: Set[str] = set()  # user nodes healed: excluded from the rewrite
        self.constants_past_half = ConstantsPastHalf(dtype)  # their readers are excluded too
        self.excluded_by_name: list = []     # compiled patterns: nodes the user keeps float32
        self.deferred_checks: Set[str] = set()  # user CheckNumerics and Asserts run with a status
        self.unguarded_writes: Dict[str, str] = {}  # user write -> variable: unscaled_training's
        self.guarded_writes: Set[str] = set()   # user writes of loss-scaled gradients kept finite
        self._scope = ""                     # name scope of the current generation ("" first)
        self._generation = 0
        self._shared: Set[str] = set()       # state sources every generation shares
        self._version = None
        self._imported: set = set()
        self._fetch_casts: Dict[str, tf.Tensor] = {}
        self._fetches: Dict[object, object] = {}  # user fetch leaf -> private element
        self._feeds: Dict[object, object] = {}    # user feed key -> private tensor
        self._rounded_feeds: List[str] = []       # fed tensors found rounded to half, unsaid
        self._lock = threading.RLock()

    @property
    def lock(self) -> threading.RLock:
        """Held while the private graph gains ops or is walked for a plan (reentrant)."""
        return self._lock

    # -- keeping in step --------------------------------------------------------------
    def sync(self) -> None:
        """Imports whatever the user graph gained since the last call (rewritten)."""
        if self.user_graph.version == self._version:  # every run asks: no lock for "no"
            return
        with self._lock:
            version = self.user_graph.version
            if version == self._version:
                return
            start = time.perf_counter()
            graph_def = self._user_graph_def()
            added = [node.name for node in graph_def.node if node.name not in self._imported]
            result = self._rewrite(graph_def, whole=False)
            to_import = self._graph_to_import(graph_def, result)
            order_reads_after_writes(to_import, {node.name for node in graph_def.node})
            self._guard_state(to_import, result)
            deferred = self._defer_checks(to_import, result)
            if self._imported:  # growth joins the current generation (after a heal, its scope)
                self._import_additions(graph_def, to_import)
            else:
                with self.graph.as_default():
                    tf.import_graph_def(to_import, name="")
                self._imported.update(node.name for node in to_import.node)
            self._version = version
            self._note_deferred(deferred)
            self._synced(graph_def, result, added, time.perf_counter() - start)
            self._say_half_writes(graph_def, added)

    def heal(self, nodes) -> RewriteReport:
        """Keeps the user graph's ``nodes`` float32 from now on: rewrites the graph again
        without converting them and imports that beside the current one, sharing every
        variable, queue and iterator (generations.py).  Returns the new rewrite's report."""
        with self._lock:
            self.kept_float32.update(nodes)
            graph_def = self._user_graph_def()
            result = self._rewrite(graph_def, whole=True)
            to_import = self._graph_to_import(graph_def, result)
            order_reads_after_writes(to_import, {node.name for node in graph_def.node})
            self._guard_state(to_import, result)
            deferred = self._defer_checks(to_import, result)
            self._import_generation(to_import)
            self.deferred_checks = set()  # the new generation's: a healed node defers none
            self._note_deferred(deferred)
            self._version = self.user_graph.version
            return result.report

    def _user_graph_def(self):
        """The user graph as the private graph holds it, before the rewrite: its histogram
        summaries leave non-finite values out (finite_histograms.py; said once), and the
        loss scaling's unscale and finite check run as the fused op (fusable.py)."""
        graph_def = self.user_graph.as_graph_def()
        if self._ops_library_usable("the loss scaling's unscale and finite check run as stock "
                                    "TensorFlow ops"):
            _fuse_unscaling(graph_def)
        filtered = filter_non_finite(graph_def, self._may_be_half(graph_def))
        if filtered:
            one = len(filtered) == 1
            log_once("tfamp_rewrite: %d histogram summar%s (e.g. '%s') of values a backward pass "
                     "or a %s node computes leave%s non-finite values out: TensorFlow's "
                     "HistogramSummary fails a run on inf or nan, which a skipped step's gradients "
                     "and an overflowing %s value are. A skipped step's gradient histograms come "
                     "out empty (count 0); histograms of float32's own values fail as in float32"
                     % (len(filtered), "y" if one else "ies", filtered[0], self.dtype,
                        "s" if one else "", self.dtype),
                     key="histogram summaries filtered")
        return graph_def

    def _may_be_half(self, graph_def):
        """Whether the rewrite of ``graph_def`` may convert a node (by name): an allow-list op
        of the session's lists that it does not keep float32 (healed, reading a constant
        past half's range, or excluded by name)."""
        allow = effective_lists(self.dtype, self.compat).allow
        kept = set(self._excluded(graph_def))
        ops = {node.name: node.op for node in graph_def.node}
        return lambda name: ops.get(name) in allow and name not in kept

    def _guard_state(self, to_import, result) -> None:
        """Makes ``to_import``'s writes to non-trainable state computed through the nodes
        ``result`` converts write finite values only (state_guard.py), said once; and the
        writes to trainable variables of values computed from loss-scaled gradients that do
        not wait on the step's finite flag (unscaled_training.unguarded_writes: a sparse
        update by hand), recorded in ``unguarded_writes`` and ``guarded_writes`` (the first
        run of one says so)."""
        writes = self.unguarded_writes = unguarded_writes(self.user_graph)
        if writes:
            self.guarded_writes.update(guard_state_writes(to_import, set(writes.values()), only=writes))
        converted = {d.name for d in result.report.decisions if d.converted}
        guarded = guard_state_writes(to_import, *self._state_variables(), through=converted,
                                     switch=STATE_GUARD_OFF)
        if guarded:
            log_once("tfamp_rewrite: %d write(s) to non-trainable state computed from %s values (batch-norm "
                     "moving averages, a queue of keys, a memory bank; e.g. '%s' to '%s') keep an "
                     "entry's value, in runs of a training step, where the value written is inf/nan: "
                     "a skipped step's %s overflow "
                     "would otherwise stay in that state for good, and evaluation return NaN long "
                     "after the heal" % (len(guarded), self.dtype, guarded[0],
                                         self._written_variable(guarded[0]), self.dtype),
                     key="guarded state writes")

    def _written_variable(self, write: str) -> str:
        """The name of the variable the user graph's ``write`` writes (past a batch norm's
        cond Switch), else of the op it writes through."""
        op = self.user_graph.get_operation_by_name(write)
        return written_variable(op) or variable_op(op.inputs[0]).name

    def _state_variables(self) -> Tuple[Set[str], Set[str]]:
        """``(variables, writes to leave)`` for state_guard.py: the user graph's
        ``state_variables`` when it holds a loss-scaled step (else none) but the gradient
        accumulators a step applies (their inf/nan must reach its finite check, which skips
        it), and the operations computed from a step's finite flag (an optimizer's own
        state, written in the branch of steps that apply)."""
        signals = step_signals(self.user_graph)
        if not signals:
            return set(), set()
        graph = self.user_graph
        state = {v.op.name for v in state_variables(graph)} - gradient_accumulators(graph)
        # Through data edges only: a write that merely waits on the train op (a MoCo queue's
        # control dependency) runs in skipped steps too.
        applied_only = {op.name for op in reachable(
            [s.all_finite.op for s in signals if s.all_finite.graph is graph],
            lambda op: [consumer for output in op.outputs for consumer in output.consumers()])}
        return state, applied_only

    def _ops_library_usable(self, instead: str) -> bool:
        """False for a session on a server, whose tasks may run in processes that did not
        load the op library; says once what happens ``instead``."""
        if not self.session_target:
            return True
        log_once("tfamp_rewrite: a session on %r: %s, not the op library's ops, as its tasks may "
                 "run in processes that never loaded the library" % (self.session_target, instead))
        return False

    def _defer_checks(self, to_import, result) -> List[str]:
        """Defers ``to_import``'s CheckNumerics outside TF1 control flow (check_deferral.py)
        and its assertions on floating-point values (assertion_deferral.py), when the user
        graph holds a loss-scaled step, and holds the writes computed from them where one
        fails (said once); returns their names."""
        if not step_signals(self.user_graph):
            return []
        user_op = self.user_graph.get_operation_by_name

        def outside_control_flow(name: str) -> bool:
            return user_op(name)._get_control_flow_context() is None

        deferred = defer_checks(to_import, outside_control_flow)
        converted = {d.name for d in result.report.decisions if d.converted}
        deferred += defer_assertions(to_import, lambda name: waits_for_the_loss_scaling(
            user_op(name), converted.__contains__))
        if not deferred:
            return deferred
        held = hold_checked_writes(to_import, deferred, outside_control_flow,
                                   leave=self._state_variables()[1])
        predicates = {s.should_apply.op.name for s in step_signals(self.user_graph)
                      if s.should_apply is not None and s.should_apply.graph is self.user_graph}
        steps = hold_checked_steps(to_import, deferred, predicates)
        if held or steps:
            parts = ["the %d write(s) computed from it (e.g. '%s') write nothing" % (len(held), held[0])
                     if held else "",
                     "the %d loss-scaled step(s) computed from it (an exploding-gradient guard before "
                     "apply_gradients) apply no update" % len(steps) if steps else ""]
            log_once("tfamp_rewrite: in a run where a check_numerics or an assertion fails, %s, as "
                     "TensorFlow's failing check stops the run before them: the checks wait for "
                     "the loss scaling, the variables keep their values"
                     % " and ".join(filter(None, parts)), key="writes held by checks")
        return deferred

    def _note_deferred(self, deferred: List[str]) -> None:
        """Records the deferred checks the private graph now runs as Identity (one imported
        before the graph had a loss-scaled step stays TensorFlow's); says so once."""
        now = {name for name in deferred
               if self.graph.get_operation_by_name(self.private_name(name)).type in _DEFERRED_AS}
        new = now - self.deferred_checks
        for kind, op_type in (("check_numerics", "CheckNumerics"), ("assertion(s)", ASSERT_OP)):
            named = sorted(n for n in new if self.user_graph.get_operation_by_name(n).type == op_type)
            if named:
                log_once("tfamp_rewrite: %d %s (e.g. '%s') wait for the loss scaling: a skipped "
                         "step's gradients and an overflowing %s value are inf/nan by design, so "
                         "%s fails the run only when its step was applied or the session cannot "
                         "act on it" % (len(named), kind, named[0], self.dtype,
                                        "a check" if op_type != ASSERT_OP else "an assertion"),
                         key="deferred " + op_type)
        self.deferred_checks |= now

    def _rewrite(self, graph_def, whole: bool):
        """The rewrite of ``graph_def`` (healed nodes kept float32), recorded in ``reports``.

        ``whole``: it replaces what the private graph runs (a new generation), rather than
        adding the nodes not imported yet.
        """
        kept_now: Dict[str, str] = {}
        for _ in range(_CONSTANT_ROUNDS):
            result = rewrite_graph_def(graph_def, dtype=self.dtype, target=self.target,
                                       numerics=self.numerics, compat=self.compat,
                                       nodes_to_exclude=self._excluded(graph_def))
            # a constant's float32 readers pass it on: their readers may read it next round
            past_half = self.constants_past_half.found_in(graph_def, result.report.casts)
            if not past_half:
                break
            self.constants_past_half.keep(past_half)
            kept_now.update(past_half)
        if kept_now:
            self.constants_past_half.say(kept_now)
        if result.report.emulation is not None and round_to_half_available() and \
                self._ops_library_usable("emulated numerics round with Cast pairs"):
            use_rounding_op(result.graph_def, result.report.emulation)
        self.rewrites += 1
        self.decisions.update((d.name, d) for d in result.report.decisions)
        self._converted_ever.update(d.name for d in result.report.decisions if d.converted)
        self.reports.append(result.report)
        if len(self.reports) > _REPORTS_KEPT:  # a graph growing every step must not grow this
            del self.reports[1]
        if result.report.emulation is not None:
            if whole:
                self._rounded.clear()
                self._emulated_half.clear()
            self._rounded.update(result.report.emulation.rounded_outputs)
            self._emulated_half.update(d.name for d in result.report.decisions
                                       if d.converted and (whole or d.name not in self._imported))
        return result

    def half_rewrite(self):
        """``(user GraphDef, RewriteResult)`` of the latest import with half dtypes in it: the
        same decisions with native numerics (under emulation too).  Made anew at each call:
        kept, the two GraphDefs would hold each of the graph's constants twice more for the
        session's life (a dataset held as a constant: hundreds of MB)."""
        with self._lock:
            graph_def = self._user_graph_def()
            return graph_def, rewrite_graph_def(graph_def, dtype=self.dtype, target=self.target,
                                                compat=self.compat,
                                                nodes_to_exclude=self._excluded(graph_def))

    def _excluded(self, graph_def) -> List[str]:
        """The nodes of ``graph_def`` the rewrite leaves float32: healed, reading a constant
        past half's range (constants_past_half.py), or named by the user's patterns
        (``excluded_by_name``; the first time some match, said once)."""
        known = {node.name for node in graph_def.node}
        named = {name for name in known if any(p.match(name) for p in self.excluded_by_name)}
        if self.excluded_by_name and not named:
            log_once("tfamp_rewrite: %s: %s match%s no node of the session graph (yet), so it "
                     "keeps none float32; node names are the graph's, e.g. %r"
                     % (NODES_TO_EXCLUDE_ENV, ", ".join(repr(p.pattern) for p in self.excluded_by_name),
                        "es" if len(self.excluded_by_name) == 1 else "", _an_example(graph_def)))
        if named:
            log_once("tfamp_rewrite: %s keeps %d node(s) of the session graph float32 by name "
                     "(e.g. %r)%s" % (NODES_TO_EXCLUDE_ENV, len(named), min(named), "".join(
                         "; %r matches none of them" % p.pattern for p in self.excluded_by_name
                         if not any(p.match(name) for name in named))))
        return sorted(((self.kept_float32 | self.constants_past_half.readers.keys()) & known) | named)

    def _import_generation(self, rewritten_def) -> None:
        """Imports ``rewritten_def`` whole, under a new scope, sharing state (generations.py)."""
        self._generation += 1
        scope = GENERATION_SCOPE % self._generation
        sources = state_sources(rewritten_def)
        import_generation(self.graph, rewritten_def, scope, sources | self._shared)
        self._shared |= sources
        self._scope = scope + "/"
        self._imported = {node.name for node in rewritten_def.node}
        self._fetches.clear()
        self._feeds.clear()
        self._fetch_casts.clear()
        self._round_when_fed.clear()

    @property
    def generation(self) -> int:
        """How many times the private graph was imported anew (a heal): mappings made
        before a change of it name the old generation's nodes."""
        return self._generation

    def state_guard_off(self):
        """The private graph's switch that turns its state guards off (fed True in a run that
        computes no loss-scaled step), or None where no write is guarded."""
        name = self.private_name(STATE_GUARD_OFF)
        return self.graph.get_tensor_by_name(name + ":0") if has_operation(self.graph, name) else None

    def private_name(self, name: str) -> str:
        """The private graph's name for the user graph's node or tensor ``name``."""
        if not self._scope or name.split(":")[0] in self._shared:
            return name
        return self._scope + name

    def user_name(self, private_name: str) -> str:
        """The user graph's name for the private graph's node or tensor ``private_name``
        (the inverse of ``private_name``; added nodes keep their own names)."""
        if self._scope and private_name.startswith(self._scope):
            return private_name[len(self._scope):]
        return private_name

    def user_source(self, tensor):
        """The private graph's ``tensor``, or, for the output of a cast or rounding the rewrite
        added, the tensor of the user's node it was made from (past every such node)."""
        while not has_operation(self.user_graph, self.user_name(tensor.op.name)) and tensor.op.inputs:
            tensor = tensor.op.inputs[0]
        return tensor

    def converted_now(self) -> Set[str]:
        """The user graph's nodes the rewrites so far convert (healed ones left out)."""
        return self._converted_ever - self.kept_float32

    def computes_in_half(self, op) -> bool:
        """Whether the private graph's ``op`` computes in half: a half output, or under
        emulated numerics a node the rewrite converted (float32 values rounded to half)."""
        return (any(t.dtype in (tf.float16, tf.bfloat16) for t in op.outputs)
                or self.user_name(op.name) in self._emulated_half)

    def _graph_to_import(self, graph_def, result):
        """What the private graph holds: the rewrite (a subclass may keep the user's graph)."""
        del graph_def
        return result.graph_def

    def _synced(self, graph_def, result, added: List[str], seconds: float) -> None:
        """Called after each import, with the user's graph and its rewrite (the nodes it
        ``added``, in ``seconds``): logs the first rewrite of the user graph and its first
        growth (Keras grows its graph at every fit, evaluate and predict), over all the
        graph's sessions, each line once per process (an Estimator builds the same graph
        anew for every evaluation); the rest goes to DEBUG.  A graph that keeps growing
        (ops built inside the user's loop) is said once at its GROWTHS_SAID_AT-th growth:
        each growth rewrites the whole graph.  The report's warnings (a misspelled list
        variable) are each said once, as warnings."""
        del graph_def
        for warning in result.report.warnings:
            log_once("tfamp_rewrite: " + warning)
        # per user graph: (rewrites seen, the largest graph version rewritten); a session
        # opened on a graph that has not grown since another's rewrite repeats it unsaid
        rewrites, largest = _SYNCS_PER_GRAPH.get(self.user_graph, (0, -1))
        grew = self._version > largest
        syncs = rewrites + grew
        _SYNCS_PER_GRAPH[self.user_graph] = (syncs, max(largest, self._version))
        line = "tfamp_rewrite: session graph %s: %s" % (
            "rewritten" if syncs == 1 else
            "grew, rewritten again (later growth is rewritten without a line each)",
            result.report.one_line())
        if grew and syncs == GROWTHS_SAID_AT + 1 and added:
            log_once("tfamp_rewrite: the session graph has grown %d times (lately by %r): each "
                     "time, the whole graph is rewritten again (%.0f ms this time to rewrite and "
                     "import it, before TensorFlow extends the session with it), so a program "
                     "that builds ops inside its training loop (a tf.reduce_mean of a fetched "
                     "value, a new summary) pays that at every step; build them once, before the "
                     "loop (said once)" % (GROWTHS_SAID_AT, added[-1], seconds * 1e3))
        if not grew or syncs > 2 or line in _SAID_SUMMARIES:
            logging.getLogger(LOGGER_NAME).debug(line)
            return
        _SAID_SUMMARIES.add(line)
        log_info(line)

    def _say_half_writes(self, graph_def, added: List[str]) -> None:
        """Says, once, an assignment among the ``added`` nodes that stores a value a
        converted node computes in a float32 variable (half_writes.py), and an angle or an
        index among them that a converted node computes (absolute_precision.py)."""
        added = set(added)
        stores = [node for node in graph_def.node if node.name in added and node.op in STORE_OPS]
        readers = [node for node in graph_def.node if node.name in added
                   and (node.op in PERIODIC or node.op in ("Cast", "LoopCond"))]
        if not stores and not readers:
            return
        by_name = {node.name: node for node in graph_def.node}

        def converted(name):
            return name in self.decisions and self.decisions[name].converted

        if stores:
            say_half_writes(half_written_variables(stores, by_name.get, converted), self.dtype)
        if readers:
            consumers: Dict[str, list] = {}
            for node in graph_def.node:
                for text in node.input:
                    if not text.startswith("^"):
                        consumers.setdefault(parse_input(text)[0], []).append(node)
            say_absolute_reads(half_absolute_reads(readers, by_name.get, converted,
                                                   lambda name: consumers.get(name, ())),
                               self.dtype, lambda name: by_name[name].op)

    def _import_additions(self, user_def, rewritten_def) -> None:
        """Imports the nodes the user graph gained into the current generation: under its
        scope after a heal (new state sources, a variable made in the loop, unscoped and
        shared), so a graph that grows every step adds its new nodes, not a whole copy."""
        new = {node.name for node in user_def.node} - self._imported
        if not new:
            return
        additions, sources_of_dropped_casts = _additions(rewritten_def, new, self._imported)
        if self._scope:
            additions_def = graph_pb2.GraphDef()
            additions_def.node.extend(additions)
            self._shared |= state_sources(additions_def)
        # The additions, beside stand-ins for the private graph's nodes they read: indexing
        # the whole private graph (every generation, the probes) at each growth made a graph
        # that grows every step slower with each one.
        combined = graph_pb2.GraphDef()
        combined.versions.CopyFrom(self.graph.graph_def_versions)
        copies = []
        for node in additions:
            copy = node_def_pb2.NodeDef()
            copy.CopyFrom(node)
            for slot, text in enumerate(copy.input):
                if text in sources_of_dropped_casts:
                    copy.input[slot] = sources_of_dropped_casts[text]
            if self._scope:
                _rename_into_generation(copy, self.private_name)
            copies.append(copy)
        stubs, stands_for = _stand_ins(self.graph, copies)
        combined.node.extend(stubs)
        first_added = len(combined.node)
        combined.node.extend(copies)
        new_functions = [f for f in rewritten_def.library.function
                         if not self.graph._is_function(f.signature.name)]
        combined.library.function.extend(new_functions)
        called = {node.op for node in copies if self.graph._is_function(node.op)}
        combined.library.function.extend(self.graph._get_function(name).definition for name in sorted(called))
        view = GraphView(combined, op_def_lookup(combined))
        reconcile_dtypes(view, range(first_added, len(view.nodes)),
                         taken_elsewhere={op.name for op in self.graph.get_operations()})
        to_import = graph_pb2.GraphDef()
        to_import.versions.CopyFrom(combined.versions)
        to_import.node.extend(combined.node[first_added:])
        to_import.library.function.extend(new_functions)
        _replace_stand_ins(to_import, stands_for)
        outside = detach_outside_references(to_import)
        with self.graph.as_default():
            tf.import_graph_def(to_import, input_map=self._input_map(to_import), name="")
        outside.reattach(self.graph)
        self._imported.update(node.name for node in additions)  # the user graph's names

    def _input_map(self, graph_def) -> dict:
        """Maps data inputs from already-imported nodes onto the private graph's tensors."""
        local = {node.name for node in graph_def.node}
        mapping = {}
        for node in graph_def.node:
            for text in node.input:
                name, port = parse_input(text)
                if name not in local and text not in mapping:
                    mapping[text] = self.graph.get_operation_by_name(name).outputs[port]
        return mapping

    # -- mapping what Session.run is given -------------------------------------------
    def private_fetch(self, element):
        """The private-graph element to fetch for a user fetch leaf (memoised)."""
        return _memoised(self._fetches, element, self._private_fetch)

    def private_feed(self, key):
        """The private-graph tensor (or SparseTensor) to feed for a user feed key (memoised)."""
        return self.private_feeds([key])[0]

    def private_feeds(self, keys) -> List:
        """``private_feed`` of each of ``keys``; those whose fed values are rounded to half
        are said in one line (an LSTM's fed-back state is several tensors)."""
        with self._lock:
            result = [_memoised(self._feeds, key, self._private_feed) for key in keys]
            rounded, self._rounded_feeds = self._rounded_feeds, []
        exact = ("values a %s node computed, fetched and fed back (an RNN's state), are exact "
                 "already; feed %s to keep others exact" % (
                     self.dtype, "a float32 placeholder" if len(rounded) == 1 else "float32 placeholders"))
        if len(rounded) == 1:
            log_once("tfamp_rewrite: %s is fed, and the rewrite runs its node in %s: the fed values "
                     "are rounded to %s (%s)" % (rounded[0], self.dtype, self.dtype, exact),
                     key="fed values rounded")
        elif rounded:
            names = ", ".join(repr(n) for n in rounded[:4]) + (", ..." if len(rounded) > 4 else "")
            log_once("tfamp_rewrite: %d fed tensors (%s) feed nodes the rewrite runs in %s: their "
                     "fed values are rounded to %s (%s)"
                     % (len(rounded), names, self.dtype, self.dtype, exact), key="fed values rounded")
        return result

    def _private_fetch(self, element):
        if isinstance(element, tf.SparseTensor):
            return tf.compat.v1.SparseTensor(*map(self.private_fetch, (
                element.indices, element.values, element.dense_shape)))
        if isinstance(element, tf.IndexedSlices):
            dense_shape = element.dense_shape
            return tf.IndexedSlices(self.private_fetch(element.values), self.private_fetch(element.indices),
                                    None if dense_shape is None else self.private_fetch(dense_shape))
        if _belongs_to(element, self.graph):
            return element
        user = self._user_fetch(element)
        if not self.user_graph.is_fetchable(user):
            return self._unfetchable(user)
        if isinstance(user, tf.Operation):
            return self.graph.get_operation_by_name(self.private_name(user.name))
        private = self.graph.get_tensor_by_name(self.private_name(self._rounded.get(user.name, user.name)))
        if private.dtype == user.dtype:
            return private
        return self._cast_back(user, private)

    def _private_feed(self, key):
        if isinstance(key, tf.SparseTensor):
            return tf.compat.v1.SparseTensor(*map(self.private_feed, (
                key.indices, key.values, key.dense_shape)))
        if isinstance(key, tf.IndexedSlices):
            dense_shape = key.dense_shape
            return tf.IndexedSlices(self.private_feed(key.values), self.private_feed(key.indices),
                                    None if dense_shape is None else self.private_feed(dense_shape))
        if _belongs_to(key, self.graph):
            return key
        try:
            user = self.user_graph.as_graph_element(key, allow_tensor=True, allow_operation=False)
        except (KeyError, TypeError, ValueError) as error:  # as Session.run words it
            raise TypeError("Cannot interpret feed_dict key as Tensor: %s" % (error.args[0],)) from None
        private = self.graph.get_tensor_by_name(self.private_name(user.name))
        if private.get_shape().is_compatible_with(user.get_shape()):
            # a shape set from Python (tf.train.batch's, set_shape after decode_png) is no
            # part of the GraphDef: Session.run checks a fed value against it, as it would
            private.set_shape(user.get_shape())
        if not self.user_graph.is_feedable(user):
            self.graph.prevent_feeding(private)  # Session.run then refuses it, as for the user graph
        elif private.dtype != user.dtype or self._emulated_half_output(user, private):
            self._rounded_feeds.append(user.name)  # said by private_feeds
        return private

    def _emulated_half_output(self, user, private) -> bool:
        """True for an output that emulation holds in half (float32 values rounded to half):
        a GPU would round what is fed there, so ``fed_value`` does."""
        if user.op.name not in self._emulated_half or user.dtype != tf.float32:
            return False
        self._round_when_fed.add(private.name)
        return True

    def fed_value(self, private_key, value):
        """``value`` as the private graph takes it: rounded to half where emulation holds the
        fed tensor in half (as a GPU's half tensor would hold it), else as it is."""
        if (not self._round_when_fed or not isinstance(private_key, tf.Tensor)
                or private_key.name not in self._round_when_fed):
            return value
        half = tf.as_dtype(self.dtype).as_numpy_dtype
        value = np.asarray(value, np.float32)
        with np.errstate(over="ignore"):
            rounded = value.astype(half).astype(np.float32)
        if np.isinf(rounded).any() and np.isfinite(value).all():
            self._say_fed_past_half(self.user_name(private_key.name), float(np.abs(value).max()))
        return rounded

    def _say_fed_past_half(self, name: str, largest: float) -> None:
        """Says, once per tensor, that the fed values of user tensor ``name``, held in half,
        do not fit: the node and the converted nodes its values reach in half are to keep
        float32 (half_readers.py)."""
        node = self.user_graph.get_tensor_by_name(name).op.name
        decisions = self.decisions

        def readers(each):
            if not has_operation(self.user_graph, each):
                return ()
            return [reader.name for output in self.user_graph.get_operation_by_name(each).outputs
                    for reader in output.consumers()]

        keep = half_readers(node, [node] if node in decisions else [], decisions, readers)
        keep = keep if node in keep else [node] + keep
        log_once("tfamp_rewrite: %r is fed values past %s's range (largest |x| %.3g), which the "
                 "rewrite holds in %s: they become inf, as a GPU's half tensor would hold them. Keep "
                 "it and the %s nodes reading it float32 with TFAMP_REWRITE_NODES_TO_EXCLUDE='%s' "
                 "(said once)" % (name, self.dtype, largest, self.dtype, self.dtype,
                                  ",".join("^%s$" % re.escape(node) for node in keep)),
                 key="fed past the half range: " + name)

    def _user_fetch(self, element):
        """The user graph's tensor or operation ``element`` names; errors as Session.run's."""
        if element is None:  # TensorFlow's own words (they differ between versions)
            from tensorflow.python.client import session as session_lib

            session_lib._FetchMapper.for_fetch(None)  # pylint: disable=protected-access
        try:
            return self.user_graph.as_graph_element(element, allow_tensor=True, allow_operation=True)
        except TypeError as error:
            raise TypeError("Fetch argument %r has invalid type %r, must be a string or Tensor. (%s)"
                            % (element, type(element).__name__, error)) from None
        except (KeyError, ValueError) as error:
            raise ValueError("Fetch argument %r cannot be interpreted as a Tensor. (%s)"
                             % (element, error.args[0])) from None

    def _unfetchable(self, user):
        """The private twin of a fetch TensorFlow marked not fetchable (inside a cond or
        loop), marked the same, so that Session.run refuses it with TensorFlow's error --
        said first when the cond is a loss-scaled step's (the program fetched it in float32)."""
        op = user if isinstance(user, tf.Operation) else user.op
        if in_loss_scaled_apply(op):
            log_once("tfamp_rewrite: %r is built inside the optimizer's apply_gradients (its "
                     "_apply_dense, for one), which a loss-scaled step runs inside a tf.cond, as "
                     "TensorFlow's own loss-scale optimizer does: a skipped step applies nothing. "
                     "TensorFlow cannot fetch a value from inside a cond, so the run fails (its "
                     "error follows); compute what you log from the gradients outside the "
                     "optimizer, or write it as a tf.summary there" % getattr(user, "name", op.name))
        private_op = self.graph.get_operation_by_name(self.private_name(op.name))
        self.graph.prevent_fetching(private_op)
        return private_op if isinstance(user, tf.Operation) else private_op.outputs[user.value_index]

    def _cast_back(self, user: tf.Tensor, private: tf.Tensor) -> tf.Tensor:
        with self._lock:
            cast = self._fetch_casts.get(user.name)
            if cast is None:
                with self.graph.as_default(), tf.compat.v1.name_scope(None):
                    name = _FETCH_CAST_SCOPE + user.name.replace(":", "_")
                    cast = tf.cast(private, user.dtype, name=name)
                self._fetch_casts[user.name] = cast
            return cast


def _memoised(cache, leaf, compute):
    # Names never change and nodes are only ever added, so a mapping stays valid.  Computed
    # outside the lookup's except clause: TensorFlow's error for a bad fetch (None, from a
    # tf.gradients of an unconnected value) must not come chained to a KeyError of ours.
    try:
        return cache[leaf]
    except KeyError:
        pass
    except TypeError:  # an unhashable leaf
        return compute(leaf)
    mapped = cache[leaf] = compute(leaf)
    return mapped


_LEAVES = (str, bytes, tf.Tensor, tf.Operation, tf.SparseTensor, tf.IndexedSlices)


def map_fetch_structure(fetches, leaf_fn):
    """``fetches`` with every leaf replaced by ``leaf_fn(leaf)``, as ``Session.run`` nests them.

    Lists, tuples, namedtuples, attrs classes and mappings (any keys: MonitoredSession keys
    its fetches by hook objects) are rebuilt with the same type; everything else is a leaf.
    """
    if isinstance(fetches, _LEAVES):  # the common case, without building a walker
        return leaf_fn(fetches)

    def walk(item):
        if isinstance(item, _LEAVES):
            return leaf_fn(item)
        if isinstance(item, collections.abc.Mapping):
            result = (type(item)(item.default_factory) if isinstance(item, collections.defaultdict)
                      else type(item)())
            for key, value in item.items():
                result[key] = walk(value)
            return result
        if isinstance(item, tuple) and hasattr(item, "_fields"):
            return type(item)(*(walk(value) for value in item))
        if isinstance(item, (list, tuple)):
            return type(item)(walk(value) for value in item)
        attributes = getattr(type(item), "__attrs_attrs__", None)
        if attributes is not None:
            return type(item)(*(walk(getattr(item, a.name)) for a in attributes))
        return leaf_fn(item)

    return walk(fetches)


def fetch_elements(mapped) -> list:
    """The tensors and operations a mapped fetch structure holds (composites' components)."""
    found = []

    def collect(leaf):
        if isinstance(leaf, (tf.Tensor, tf.Operation)):
            found.append(leaf)
        elif isinstance(leaf, (tf.SparseTensor, tf.IndexedSlices)):
            found.extend(t for t in (getattr(leaf, "indices", None), getattr(leaf, "values", None),
                                     getattr(leaf, "dense_shape", None)) if isinstance(t, tf.Tensor))
        return leaf

    map_fetch_structure(mapped, collect)
    return found


def has_operation(graph, name: str) -> bool:
    """Whether ``graph`` holds an operation named ``name``."""
    try:
        graph.get_operation_by_name(name)
    except KeyError:
        return False
    return True


def _fuse_unscaling(graph_def) -> None:
    """Swaps the fused op in for ``graph_def``'s stock-op unscale groups, where it loads (the
    op's loader says once which it is); a group left as stock ops is said once, with why."""
    if not any(MARKER_ATTR in node.attr for node in graph_def.node) or not fused_op_available():
        return
    _, left = fuse_unscale_groups(graph_def)
    for scope, why in sorted(left.items()):
        log_once("tfamp_rewrite: the loss scaling's unscale and finite check in '%s' runs as "
                 "stock TensorFlow ops, not the fused op (the same values, one kernel per "
                 "gradient): %s" % (scope, why))


def _an_example(graph_def) -> str:
    """A node name of ``graph_def`` to show what names look like: a MatMul's or Conv's, if any."""
    for node in graph_def.node:
        if node.op in ("MatMul", "Conv2D", "BatchMatMulV2", "Conv2DBackpropInput"):
            return node.name
    return graph_def.node[-1].name if graph_def.node else ""


def _belongs_to(element, graph) -> bool:
    return isinstance(element, (tf.Tensor, tf.Operation)) and element.graph is graph


def _stand_ins(graph: tf.Graph, nodes) -> tuple:
    """``(stubs, stands_for)``: a Placeholder for each output of ``graph``'s nodes that
    ``nodes`` read (its dtype and device, so that dtypes can be reconciled), a NoOp for each
    one read by a control input alone; ``nodes``' inputs now name the stubs, and
    ``stands_for`` maps each stub's name back to the input it replaced."""
    local = {node.name for node in nodes}
    stubs: Dict[str, object] = {}
    stands_for: Dict[str, str] = {}
    for node in nodes:
        for slot, text in enumerate(node.input):
            control = text.startswith("^")
            name, port = parse_input(text.lstrip("^"))
            if name in local:
                continue
            op = graph.get_operation_by_name(name)
            stub_name = name if port == 0 else "%s/_tfamp_port_%d" % (name, port)
            if not control:
                node.input[slot] = stub_name
            stands_for[stub_name] = _input_text(name, port)
            if stub_name in stubs and (control or stubs[stub_name].op == "Placeholder"):
                continue
            stub = node_def_pb2.NodeDef(name=stub_name, device=op.device)
            if control:
                stub.op = "NoOp"
            else:
                stub.op = "Placeholder"
                stub.attr["dtype"].type = op.outputs[port].dtype.base_dtype.as_datatype_enum
            stubs[stub_name] = stub
    return list(stubs.values()), stands_for


def _replace_stand_ins(graph_def, stands_for: Dict[str, str]) -> None:
    """Points ``graph_def``'s inputs naming a stub (``_stand_ins``) back at what it stands for."""
    for node in graph_def.node:
        for slot, text in enumerate(node.input):
            control = text.startswith("^")
            name, port = parse_input(text.lstrip("^"))
            if name not in stands_for:
                continue
            real = stands_for[name]
            if control:
                node.input[slot] = "^" + parse_input(real)[0]
            else:
                real_name, real_port = parse_input(real)
                node.input[slot] = _input_text(real_name, real_port + port)


def _input_text(name: str, port: int) -> str:
    """How a NodeDef names output ``port`` of node ``name`` as an input."""
    return name if port == 0 else "%s:%d" % (name, port)


def _rename_into_generation(node, private_name) -> None:
    """``node`` (user graph names) renamed, with its inputs and colocations, as the private
    graph's current generation names them (``private_name``)."""
    node.name = private_name(node.name)
    for slot, text in enumerate(node.input):
        control = text.startswith("^")
        name, port = parse_input(text.lstrip("^"))
        renamed = private_name(name)
        node.input[slot] = "^" + renamed if control else _input_text(renamed, port)
    if "_class" in node.attr:
        locations = [b"loc:@" + private_name(c[len(b"loc:@"):].decode()).encode()
                     for c in node.attr["_class"].list.s]
        del node.attr["_class"].list.s[:]
        node.attr["_class"].list.s.extend(locations)


def _additions(rewritten_def, new: set, imported: set):
    """Nodes of ``rewritten_def`` to import now, and replacements for dropped Casts.

    New user nodes are imported with the Casts the rewrite put after new nodes.  A Cast the
    rewrite put after an already-imported node assumed that node's dtype in the fresh
    rewrite; it is dropped and its consumers read the node directly, leaving
    ``reconcile_dtypes`` to cast according to the dtype the node really has.  Emulation's
    Casts (and RoundToHalf nodes) are float32 -> half -> float32 whatever the node's paint:
    they are imported.  So are the nodes the session adds beside a new node (a state write's
    guard, a deferred check's status: ``<node>/tfamp_...``), and the state guards' switch
    where the first guarded write is a new one.
    """
    additions, dropped = [], {}
    for node in rewritten_def.node:
        if node.name in new or (node.name not in imported and (
                is_emulation_node(node) or node.name.split(_HELPER_SCOPE, 1)[0] in new
                or node.name.split("/", 1)[0] == STATE_GUARD_OFF)):
            additions.append(node)
        elif node.name not in imported and node.op == "Cast" and node.name.endswith(CAST_SUFFIX):
            source, _ = parse_input(node.input[0])
            if source in new:
                additions.append(node)
            else:
                dropped[node.name] = node.input[0]
    return additions, dropped

"""Where an inf/nan a session said starts, and what keeping it float32 takes.

Once an inf/nan is said (inference_watch.py), ``start`` opens a search: the next runs that
compute the node it was said of (at most ``ORIGIN_RUNS``; runs that never compute it -- a
training loop after a feature extractor fetched once -- neither find nor rule it out) each
fetch whether the tensors of their half region hold inf/nan (``plan``, non_finite_origin.py;
a training run its forward pass only: a skipped step's gradients are the loss scale's),
and the first run that shows one names where it starts, with the edit that keeps it
float32 (``after_run``).  What to keep:

    the origin's own nodes (a half node that overflowed, or the half readers of a float32
      value past the half range), and those of every other origin independent of it
    the converted nodes its value reaches in half through ones that pass its size on
      (half_readers.py: a -1e9 mask subtracted, then concatenated)
    for a TF1 while loop's Exit, the loop's converted nodes (while_loops.py): its tensors
      cannot be fetched, so its inf/nan is first seen leaving it

A run whose inf/nan first shows in a fed or float32 value (an L-BFGS loop feeding back the
NaN image an earlier run returned) still keeps the half nodes that overflow on their own
beside it; with none, it is one of the search's runs, and mixed precision is said not to
cause it only once they all end so.

After a heal (``healed``) a run that returns inf/nan again starts the search again
(``again_if_non_finite``); the session's heal limit bounds the rounds.  A search that
finds nothing in ``ORIGIN_RUNS`` runs says so, and so does a session closed mid-search.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ..doctor.fixes import fix_for
from ..doctor.probes import HalfNode
from .devices import log_once, nodes_to_exclude_setting
from .half_readers import half_readers
from .heal_memory import HEAL_FILE_ENV
from .non_finite_origin import ADDED, FED, FLOAT32, NonFiniteOrigin, Origin
from .op_walks import ancestors, reachable
from .shadow_graph import has_operation
from .state_guard import WRITE_OPS, value_input, written_variable
from .twins import twin_nodes
from .variable_check import VARIABLE_OPS
from .while_loops import while_loops

ORIGIN_RUNS = 8  # runs that look for the origin, once inf/nan was said


class OriginSearch:
    """One rewriting session's search for where the inf/nan it said starts."""

    def __init__(self, shadow):
        self.shadow = shadow
        self._in_inference = NonFiniteOrigin(shadow)
        self._in_training = NonFiniteOrigin(shadow, forward_only=True)
        self._runs_left = 0              # runs left to look
        self._again_after_heal = False   # healed: a run returning inf/nan again starts again
        self._healed = False             # a heal followed one of its finds
        self._stored: Optional[Tuple[str, str]] = None  # (write, variable) the said value went to
        self.kept_for_good = False  # found in a variable that keeps it: nothing more to watch
        self._failed_runs = 0            # runs that failed an assertion before they could look
        self._outside_runs: List[str] = []  # per run found starting in a fed or float32 value: its tensor
        self._from_state: Optional[Origin] = None  # a returned inf/nan computed from variables
        self._said_node: Optional[str] = None  # the user node whose inf/nan was said, if known
        # the search ended finding no origin in float16 (float32's own, or it did not recur):
        # the session watches its runs again (InferenceWatch.after_run)
        self.ended_without_origin = False
        self._computes_said: Dict[tuple, bool] = {}  # (generation, node, run) -> computes it
        self._said_half_upstream = None  # ((generation, node), the half ops computing it)
        self._restarted_unsaid = False   # the search runs again after a heal, unsaid

    @property
    def said_node(self) -> Optional[str]:
        """The user node whose inf/nan the search looks for (None: not known)."""
        return self._said_node

    def start(self, said) -> None:
        """Opens a search for the inf/nan said of ``said``: a fetch, a name, a ``Hidden``
        entry, or None (not known: every run looks)."""
        name = getattr(said, "tensor", None) or getattr(said, "name", said)
        self._said_node = name.split(":")[0] if isinstance(name, str) and name else None
        self._runs_left = ORIGIN_RUNS
        self._outside_runs = []
        self._restarted_unsaid = False
        self._stored = self._stored_by(said)
        self._from_state = None

    def _stored_by(self, said) -> Optional[Tuple[str, str]]:
        """``(write, variable)`` when ``said`` is a value a write of the user graph stores (a
        ``Hidden`` entry read by one, the write's fetched output, or a value computed from
        it: a ``tf.metrics`` update op, total / count): the variable keeps that inf/nan for
        the later runs."""
        graph = self.shadow.user_graph
        write = getattr(said, "reader", None) if hasattr(said, "reader_op") else self._said_node
        if write is None or not has_operation(graph, write):
            return None
        op = graph.get_operation_by_name(write)
        if op.type not in WRITE_OPS:
            # a ref variable's AssignAdd, or a resource variable's read after its write
            near = [t.op for t in op.inputs]
            near += [each for read in near for each in read.control_inputs]
            op = next((each for each in near if each.type in WRITE_OPS
                       and _writes_floating(each)), None)
            if op is None:
                return None
        variable = written_variable(op)
        return (op.name, variable) if variable is not None else None

    def active(self) -> bool:
        """Whether runs are to look: inf/nan was said, its origin was not, and fewer than
        ``ORIGIN_RUNS`` runs that compute its node looked."""
        return self._runs_left > 0

    def plan(self, elements, fed=(), training: bool = False):
        """What a run of ``elements`` (private graph) fetches to look, or None: the search is
        off, or the run does not compute the node said."""
        if not self.active() or not self._computes_said_node(elements, fed):
            return None
        return (self._in_training if training else self._in_inference).fetches(elements, fed)

    def healed(self) -> None:
        """The session healed the origin found: the next run returning inf/nan looks again."""
        self._again_after_heal = True
        self._healed = True

    def healed_by_a_step(self, nodes) -> None:
        """A skipped step's diagnosis healed ``nodes`` (user names): where they hold the node
        whose inf/nan was said (a forward-only print of a layer's range, run before the
        training steps overflowed the same layer), the search ends as healed, unsaid -- its
        close must not say nothing was found -- and a run returning inf/nan again looks anew."""
        if nodes and self.active() and self._said_node in nodes:
            self._runs_left = 0
            self.healed()

    def waits_after_heal(self) -> bool:
        """Whether a heal asks the next run's values to be looked at (``again_if_non_finite``);
        otherwise a run after something was said costs nothing more."""
        return self._again_after_heal

    def again_if_non_finite(self, found) -> None:
        """After a heal, a run (inferring or training) that returns inf/nan again (``found``:
        the fetch holding it, or None) starts the search again, unsaid."""
        if found is not None and self._again_after_heal:
            self._again_after_heal = False
            self.start(found)
            self._restarted_unsaid = True

    def failed_again(self, healing: bool) -> None:
        """A run computing the said node failed before it could be looked at (an assertion
        below it): counted, for ``session_closed`` to say; ``healing``: the session heals
        the nodes nearest up from it, which ends the search."""
        self._failed_runs += 1
        if healing:
            self._runs_left = 0

    def session_closed(self) -> None:
        """Says, once per process, that a session closed while its search was on: an
        evaluation's session (an Estimator's) may end before ``ORIGIN_RUNS`` runs looked."""
        if not self.active():
            return
        looked, self._runs_left = ORIGIN_RUNS - self._runs_left, 0  # close() may come twice
        if self._said_from_state() or (self._restarted_unsaid and not looked):
            return  # a search restarted unsaid after a heal, that no run came to: nothing to say
        if self._outside_runs and not self._failed_runs:
            log_once("tfamp_rewrite: a session closed while looking for where the inf/nan said "
                     "above starts: in %d of the %d later run(s) that looked, it was in a fed or "
                     "float32 value already (%r) before any %s node read it, so mixed precision "
                     "did not cause it there (a variable a checkpoint filled with it, a fed NaN) "
                     "-- unless an earlier run computed what was fed or stored (a loop feeding "
                     "back its output) (said once)" % (
                         len(self._outside_runs), looked, self._outside_runs[0], self.shadow.dtype),
                     key="a session closed while looking")
            return
        log_once("tfamp_rewrite: a session closed while looking for where the inf/nan said above "
                 "starts: %s, so nothing was found or ruled out. If float32 gives inf/nan there too "
                 "(a 0/0 of the model's own), mixed precision did not cause it; tfamp-rewrite doctor, "
                 "given such an input, names the node (said once)"
                 % ("%d of its later runs failed before their values could be looked at"
                    % self._failed_runs if self._failed_runs else
                    "%d of its later runs looked and none showed it" % looked if looked
                    else "no later run computed that node and ran to its end (it made none, or "
                    "they failed first)"))

    def _computes_said_node(self, elements, fed=()) -> bool:
        """Whether a run of ``elements`` (private graph) computes the node whose inf/nan was
        said, or reads the variable it was stored in (True when that is not known): only
        such runs look for its origin, and count
        towards the ``ORIGIN_RUNS`` the search lasts -- a training loop that never computes
        a feature extractor fetched once neither finds nor rules out its overflow."""
        if self._said_node is None:
            return True
        names = tuple(getattr(e, "name", str(e)) for e in elements)
        key = (self.shadow.private_name(""), self._said_node, names, tuple(sorted(t.name for t in fed)))
        known = self._computes_said.get(key)
        if known is None:  # or reads the variable the said value was stored in
            private = {self.shadow.private_name(name) for name in
                       [self._said_node] + ([self._stored[1]] if self._stored else [])}
            computed = ancestors(elements, {t.name for t in fed})
            known = any(op.name in private for op in computed)
            if not known and self._stored is not None:
                # a run of the half nodes the stored value came from (a covariance fetched
                # again after its inverse went into a variable): where it starts, seen again
                known = bool(computed & self._half_upstream_of_said())
            self._computes_said[key] = known
        return known

    def _half_upstream_of_said(self) -> set:
        """The private graph's half ops the said node is computed from (the current
        generation's; kept until the next search)."""
        key = (self.shadow.private_name(""), self._said_node)
        if self._said_half_upstream is None or self._said_half_upstream[0] != key:
            graph = self.shadow.graph
            name = self.shadow.private_name(self._said_node)
            said = [graph.get_operation_by_name(name)] if has_operation(graph, name) else []
            half = {op for op in ancestors(said) if self.shadow.computes_in_half(op)}
            self._said_half_upstream = (key, half)
        return self._said_half_upstream[1]

    def after_run(self, plan, statuses, returned_non_finite: bool
                  ) -> Optional[Tuple[Origin, List[str]]]:
        """Says where the inf/nan starts if this run (fetching ``plan``) shows it, and returns
        that origin and the nodes to keep float32 -- its own and those of every other origin
        independent of it -- when keeping them would avoid it; a run that returned inf/nan
        (``returned_non_finite``) while its half region held none says float16 did not."""
        if statuses is None or self._runs_left <= 0:
            return None
        origin = NonFiniteOrigin.first(plan.entries, statuses)
        if origin is None and returned_non_finite:
            self._runs_left, self.ended_without_origin = 0, True
            log_once("tfamp_rewrite: the inf/nan said above does not start in the %s nodes: a later "
                     "run returned inf/nan while none of them, nor any value they read, held any. It "
                     "comes from float32 nodes -- which the %s nodes' rounding may still have led "
                     "there: a variance computed from them that comes out negative, then a sqrt -- "
                     "or from a variable an earlier run made inf/nan (a tf.metrics total that "
                     "summed a skipped step's NaN loss, until its local variables are reset) (said "
                     "once)" % (self.shadow.dtype, self.shadow.dtype))
            return None
        if origin is None:
            self._runs_left -= 1
            if self._runs_left == 0:
                self.ended_without_origin = True
                if self._said_from_state():
                    return None
                if self._healed:
                    log_once("tfamp_rewrite: after the heal a run returned inf/nan again, and the "
                             "%d runs since found none in the %s nodes nor in the values they "
                             "read: the heal holds, and that inf/nan came from before it took "
                             "effect (the run's own, or a value an earlier run stored) (said once)"
                             % (ORIGIN_RUNS, self.shadow.dtype))
                    return None
                log_once("tfamp_rewrite: the search for where the inf/nan said above starts has "
                         "ended: %d later runs found none in the %s nodes nor in the values they "
                         "read. It did not recur (an input out of range once), or it starts in "
                         "float32 nodes; tfamp-rewrite doctor, given such an input, names the node "
                         "(said once)" % (ORIGIN_RUNS, self.shadow.dtype))
            return None
        independent = NonFiniteOrigin.independent(plan.entries, statuses)
        keep = origin.nodes_to_keep()
        if not keep:  # fed or float32 -- a half node may still overflow on its own beside it
            own = [each for each in independent if each.nodes_to_keep()]
            if not own:
                self._outside_float16(origin, independent)
                return None
            origin, keep = own[0], own[0].nodes_to_keep()
        self._runs_left = 0
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
        others = [each for each in independent if each is not origin and each.nodes_to_keep()]
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
                 "graph): %s. Keep %s float32: these nodes alone with %s, every node of their "
                 "op types with %s (said once)" % (
                     where, "them" if len(keep) > 1 else "it",
                     nodes_to_exclude_setting(["^%s$" % re.escape(name) for name in keep + twins]),
                     self.list_edit(keep)))
        return origin, keep

    def _outside_float16(self, origin: Origin, independent: List[Origin] = ()) -> None:
        """A run whose inf/nan starts in a fed or float32 value, no half node overflowing on
        its own: it rules nothing out -- an L-BFGS loop feeds back the NaN image an earlier
        run returned -- so the search goes on over the next runs, and says, when they end
        alike, that mixed precision did not cause it."""
        self._runs_left -= 1
        self._outside_runs.append(origin.tensor)
        if self._runs_left > 0:
            return
        self.ended_without_origin = True
        from_stored = [each for each in [origin, *independent] if self._stored is not None
                       and each.kind != FED and self._reads(each.node, self._stored[1])]
        from_state = [each for each in [origin, *independent] if self._stored is not None
                      and each.kind != FED and self._reads_state(each.node)]
        if from_stored or from_state:
            self._say_stored((from_stored or from_state)[0], direct=bool(from_stored))
            self.kept_for_good = True
            return
        variable = origin.kind != FED and self._variable_value(origin.node)
        if variable and self._healed:
            log_once("tfamp_rewrite: the inf/nan of this session's runs now starts outside %s: "
                     "variable %r holds it before any %s node reads it. A run before the heal "
                     "wrote %s's inf/nan into it (an update that no loss scaling skips), so the "
                     "heal came too late for it: restore the variables from a checkpoint saved "
                     "before, or start again healed (%s=path keeps the heals for the next run) "
                     "(said once)" % (self.shadow.dtype, variable, self.shadow.dtype,
                                      self.shadow.dtype, HEAL_FILE_ENV))
            return
        fed_back = (" in these runs -- but this session healed a %s overflow before them: a value "
                    "an earlier run computed and the program feeds back (an ICP or L-BFGS loop) "
                    "carries that run's inf/nan, float16's where it overflowed there: start the "
                    "loop again from its first value"
                    % self.shadow.dtype if self._healed else "")
        log_once("tfamp_rewrite: the inf/nan of this session's runs starts outside %s: %s %r "
                 "holds it before any %s node reads it, so mixed precision did not cause it%s "
                 "(said once)" % (self.shadow.dtype, "the fed value" if origin.kind == FED
                                  else "the float32 value", origin.tensor, self.shadow.dtype,
                                  " in these runs (a write of an earlier run put it in variable %r)"
                                  % variable if variable else fed_back))

    def returned_from_state(self, found) -> None:
        """A run with no half node to look at returned inf/nan (``found``: the fetch holding
        it, or None): where the said value went into a variable, and the fetch is computed
        from the program's variables, that is kept as the search's answer should it end
        finding nothing (``_say_stored``) -- a run that computes the write again may still
        find its half node, and heal it."""
        name = getattr(found, "name", found)
        if self._stored is None or not isinstance(name, str) or not name or self._from_state:
            return
        node = name.split(":")[0]
        if self._reads_state(node):
            self._from_state = Origin(tensor=name, kind=FLOAT32, node=node, op="")

    def _said_from_state(self) -> bool:
        """Says, where the search ends having found nothing, that the inf/nan a run with no
        half node returned came from the variable the said value was stored in."""
        if self._from_state is None:
            return False
        self._say_stored(self._from_state, direct=self._reads(self._from_state.node, self._stored[1]))
        self.kept_for_good = True
        return True

    def _say_stored(self, origin: Origin, direct: bool = True) -> None:
        """Says that the float32 ``origin`` of the later runs' inf/nan reads the variable a
        write stored the said inf/nan in (``direct``), or other variables of the program
        (EM's variances, written from the means the inf went into), and which half nodes
        computed the stored value."""
        write, variable = self._stored
        graph, converted = self.shadow.user_graph, self.shadow.converted_now()
        half = sorted(op.name for op in ancestors([graph.get_operation_by_name(write)])
                      if op.name in converted)
        where = ("variable %r, which the float32 value %r reads" % (variable, origin.tensor) if direct
                 else "the float32 value %r, computed from the program's variables" % origin.tensor)
        if not half:  # healed since: the variable still holds what was stored before
            healed = sorted(op.name for op in ancestors([graph.get_operation_by_name(write)])
                            if op.name in self.shadow.kept_float32)
            local = variable in {v.op.name for v in graph.get_collection("local_variables")}
            log_once("tfamp_rewrite: the inf/nan of this session's later runs starts in %s: the write "
                     "%r stored %s's inf/nan in variable %r before the heal of %s, and the variable "
                     "keeps it for good (an update no loss scaling skips; an accumulation never "
                     "clears it). Its value is computed in float32 now: %s (said once)"
                     % (where, write, self.shadow.dtype, variable,
                        ", ".join(repr(n) for n in healed[:3]) or "its nodes",
                        "tf.local_variables_initializer() resets a tf.metrics total" if local
                        else "assign it again, or restore it from values saved before"),
                     key="stored inf/nan: healed since")
            return
        between = _float32_making_inf(graph.get_operation_by_name(write), half, converted)
        if between:
            log_once("tfamp_rewrite: the inf/nan of this session's later runs starts in %s: the write "
                     "%r of the run said above stored inf/nan in variable %r (an update no loss "
                     "scaling skips), computed in float32 (%s) from %d %s node(s). If float32 stores "
                     "inf/nan there too (an exp of a large value), mixed precision did not cause it; "
                     "if not, keep those nodes float32 (%s) and start again from values saved "
                     "before (said once)"
                     % (where, write, variable, ", ".join(repr(n) for n in between[:3]), len(half),
                        self.shadow.dtype,
                        nodes_to_exclude_setting(["^%s$" % re.escape(name) for name in half])),
                     key="stored inf/nan: float32 computing")
            return
        log_once("tfamp_rewrite: the inf/nan of this session's later runs starts in %s: the write "
                 "%r of the run said above stored %s's inf/nan in variable %r (an update no loss "
                 "scaling skips), which keeps it for good and passes it on to what is computed "
                 "from it, so mixed precision did cause it. Keep the %d %s node(s) computing that "
                 "value float32 (%s) and start again from values saved before (said once)"
                 % (where, write, self.shadow.dtype, variable, len(half), self.shadow.dtype,
                    nodes_to_exclude_setting(["^%s$" % re.escape(name) for name in half])))

    def _reads_state(self, node: str) -> bool:
        """Whether user node ``node`` is computed from any variable's value."""
        if not has_operation(self.shadow.user_graph, node):
            return False
        user_op = self.shadow.user_graph.get_operation_by_name(node)
        return any(op.type in VARIABLE_OPS for op in ancestors([user_op]))

    def _reads(self, node: str, variable: str) -> bool:
        """Whether user node ``node`` is computed from ``variable``'s value."""
        if not has_operation(self.shadow.user_graph, node):
            return False
        user_op = self.shadow.user_graph.get_operation_by_name(node)
        return any(op.name == variable for op in ancestors([user_op]))

    def _variable_value(self, node: str) -> Optional[str]:
        """The variable whose value user node ``node`` is (the variable, or its read), or None."""
        if not has_operation(self.shadow.user_graph, node):
            return None
        op = self.shadow.user_graph.get_operation_by_name(node)
        if op.type in ("Identity", "ReadVariableOp") and op.inputs:
            op = op.inputs[0].op
        return op.name if op.type in VARIABLE_OPS else None

    def _loop_left_by(self, origin: Origin) -> Optional[Tuple[str, List[str]]]:
        """(frame, its converted nodes) when ``origin`` is the Exit of a TF1 while loop with
        converted nodes: the inf/nan started inside, where no tensor can be fetched."""
        if origin.op not in ("Exit", "RefExit"):
            return None
        loop = while_loops(self.shadow.user_graph.as_graph_def()).get(origin.node)
        converted = self.shadow.converted_now()
        half = [name for name in (loop[1] if loop else ()) if name in converted]
        return (loop[0], half) if half else None

    def _with_half_readers(self, origin: Origin, keep: List[str]) -> List[str]:
        """``keep`` (``origin``'s nodes to keep float32) and the converted nodes its value
        would reach in half once they are float32 (half_readers.py)."""
        decisions = self.shadow.decisions
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
        decisions = self.shadow.decisions
        return fix_for([HalfNode(n, decisions[n].op, decisions[n].category) for n in names]).env


# Float32 ops that turn finite values into inf/nan of their own (exp(120), log(0)): a value
# stored from one may be float32's inf as much as float16's.
_MAKE_INF_OF_FINITE = frozenset({"Exp", "Expm1", "Pow", "Log", "Log1p", "Sqrt", "Rsqrt", "Reciprocal",
                                 "Inv", "Xlogy", "Xdivy", "Lgamma", "Digamma", "Tan", "Acos", "Asin",
                                 "Atanh", "Acosh"})
def _float32_making_inf(write, half: List[str], converted) -> List[str]:
    """The names (sorted) of the float32 ops of ``_MAKE_INF_OF_FINITE`` between ``half``
    nodes and ``write``."""
    upstream = ancestors([write])
    downstream = reachable([op for op in upstream if op.name in half],
                           lambda op: [c for t in op.outputs for c in t.consumers() if c in upstream])
    return sorted(op.name for op in downstream
                  if op.name not in converted and op.type in _MAKE_INF_OF_FINITE)


def _writes_floating(write) -> bool:
    """Whether write op ``write`` writes a floating value."""
    value = write.inputs[value_input(write.type)] if len(write.inputs) > value_input(write.type) else None
    return value is not None and value.dtype.base_dtype.is_floating

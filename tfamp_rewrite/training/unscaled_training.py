"""Saying so when a run trains in float16 without loss scaling.

Automatic loss scaling (``TF_ENABLE_AUTO_MIXED_PRECISION=1``, ``tfamp-run``) wraps
``tf.compat.v1.train`` optimizers.  A graph updated by anything else -- a Keras optimizer
(``model.compile("adam")``), an optimizer built before loss scaling was switched on or with
it switched off, a subclass whose own ``apply_gradients`` assigns the new values (BERT's
``AdamWeightDecayOptimizer``) -- computes its float16 gradients from an unscaled loss,
where values below float16's smallest subnormal (6e-8) flush to zero.  It still trains, so nothing fails; the
session says it once, at the first run that computes such an update (a graph loaded only to
serve, whose train op never runs, is not trained and is not warned about).

An assignment to a trainable variable of a value computed from a loss-scaled step's
gradients, that does not wait on the step's finite flag (SAM's weight perturbation
``w += rho * g / |g|``), is loss-scaled, but writes the inf/nan of a skipped step's
gradients into the variable for good: ``unguarded_writes`` finds them, and the first run
that computes one says so once.

Gradients used as values -- ``tf.gradients(loss, x)`` for an adversarial example (FGSM) or
a saliency map -- are no optimizer's, so nothing scales their loss, and computed in float16
their small entries flush to zero: ``unscaled_backprops`` finds the ``tf.gradients`` calls
with converted nodes whose loss no loss scale multiplies (nor a constant of the user's,
``loss * 1024.``, which is the advised fix) and whose results reach no update
(past a ``stop_gradient``, an adversarial example's does not), and the first run that
computes one says so once.
"""
from __future__ import annotations

import re
from typing import Dict, List

from .devices import log_once
from .gradient_accumulation import gradient_accumulators
from .keras_compat import loss_scale_optimizer_name
from .op_walks import ancestors, downstream_of, reachable, value_consumers
from .own_loss_scale import own_scale
from .state_guard import WRITE_OPS, value_input, variable_op
from .step_signals import loss_scale_variables, step_signals

_UPDATE_OP = re.compile(r"^(Resource)?(Sparse)?Apply[A-Z]")
# Writes by hand: assignments, and the scatters a sparse (IndexedSlices) update makes
# (word2vec's scatter_sub of an embedding's gradient rows), slice assignments too.
_ASSIGN_OPS = WRITE_OPS
# tf.gradients' default name scope, at the top or under another (Keras' optimizers take
# theirs under "training/<Optimizer>/gradients/").
GRADIENT_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")
_VARIABLE_OPS = ("VariableV2", "VarHandleOp")
# tf.gradients' seed of ones; "grad_ys_0_1" where a call reused a scope an imported graph
# already holds (import_meta_graph), its ops uniquified alike ("MatMul_grad_1/MatMul")
_GRADIENT_SEED = re.compile(r"(^|/)gradients(_\d+)?/grad_ys_\d+(?P<again>_\d+)?$")
_GRADIENT_STOPS = ("StopGradient", "PreventGradient")
_FINITE_CHECK = "unscale_and_check_finite"  # a loss-scaled optimizer's check of what it applies


def unscaled_updates(graph, dtype: str) -> List:
    """The update ops of ``graph`` that no loss scaling covers, if it runs in float16 (and
    has no Keras loss scale of its own), else an empty list: the optimizers' ``Apply*`` ops,
    and assignments to a trainable variable of values computed from ``tf.gradients``, that
    do not wait on a loss-scaled step's finite flag, or (an assignment) are not computed
    from a loss-scaled step's values (a model trained with a Keras optimizer beside one a
    loss-scaled optimizer trains is named)."""
    if dtype != "float16":
        return []
    signals = step_signals(graph)
    if any(s.should_apply is None for s in signals):  # a fixed scale: its update waits on no flag
        return []
    ours = {v.op.name for v in loss_scale_variables(signals)}
    updates, assigns = [], []
    for op in graph.get_operations():
        if _UPDATE_OP.match(op.type):
            updates.append(op)
        elif op.type in _ASSIGN_OPS:
            assigns.append(op)
        elif op.type in _VARIABLE_OPS and "loss_scale" in op.name and op.name not in ours:
            return []  # Keras' LossScaleOptimizer
    if assigns:
        trainable = {v.op.name for v in graph.get_collection("trainable_variables")}
        assigns = [op for op in assigns if op.inputs[0].op.name in trainable]
    if assigns:  # values computed from gradients: a projection w.assign(max(w, 0)) after the
        # step only waits on it
        from_gradients = reachable([op for op in graph.get_operations() if GRADIENT_SCOPE.search(op.name)],
                                   value_consumers)
        updates.extend(op for op in assigns if op in from_gradients)
    if updates:  # by a loss-scaled step, or from a loss the program scales (a fixed scale's)
        sources = ([s.all_finite.op for s in signals if s.all_finite.graph is graph]
                   + _loss_scale_variables(graph, signals) + _backprops_of_scaled_losses(graph))
        # an optimizer's Apply in a loss-scaled step's cond waits on its pivot; a write by hand
        # is scaled only if its value is (an unrolled inner step waiting on an outer
        # loss-scaled step writes its own tf.gradients' values)
        scaled = downstream_of(graph, sources)
        scaled_values = reachable(sources, value_consumers)
        updates = [op for op in updates
                   if op not in (scaled_values if op.type in _ASSIGN_OPS else scaled)]
    return updates


def _backprops_of_scaled_losses(graph) -> List:
    """The gradient ops of the losses ``graph``'s ``tf.gradients`` calls differentiate that
    the program scales itself (own_loss_scale.py; TensorFlow's loss-scale optimizer with a
    fixed scale too): ``<scope>/<loss>_grad/...``."""
    prefixes = tuple("%s/%s_grad/" % (scope, loss.name)
                     for scope, losses in _scaled_losses(graph).items() for loss in losses)
    return [op for op in graph.get_operations() if op.name.startswith(prefixes)] if prefixes else []


def _built_here(op) -> bool:
    """Whether Python of this process built ``op`` (an imported op carries no traceback)."""
    return bool(getattr(op, "traceback", None))


def unguarded_writes(graph) -> Dict[str, str]:
    """``{assign op name: variable name}``: assignments to trainable variables of values
    computed from a loss-scaled step's gradients that do not wait on its finite flag --
    but to a variable the step applies as gradients (an accumulator, which hands the inf/nan
    to the step's finite check)."""
    signals = [s for s in step_signals(graph) if s.all_finite.graph is graph]
    if not signals:
        return {}
    trainable = ({v.op.name for v in graph.get_collection("trainable_variables")}
                 - gradient_accumulators(graph))
    assigns = [op for op in graph.get_operations()
               if op.type in _ASSIGN_OPS and op.inputs[0].op.name in trainable]
    if not assigns:
        return {}
    # the value written, through values: SAM's restore w -= e under a control dependency on
    # the gradients writes e, which holds none
    from_gradients = reachable(_loss_scale_variables(graph, signals), value_consumers)
    guarded = downstream_of(graph, [s.all_finite.op for s in signals])
    return {op.name: op.inputs[0].op.name for op in assigns
            if len(op.inputs) > value_input(op.type) and op.inputs[value_input(op.type)].op in from_gradients
            and op not in guarded and not _UPDATE_OP.match(op.type)}


def unscaled_backprops(graph, converted) -> Dict[str, str]:
    """``{op name: scope}``: the ops of each ``tf.gradients`` call of ``graph`` (its scope,
    "gradients_1") that holds a node of ``converted`` (names), whose loss neither a loss
    scale nor a constant of the user's multiplies, and whose results reach no update
    (module docstring).  A gradient penalty's inner call reaches one, and is left out: the
    entries that flush are those below 6e-8, whose squares add nothing to a norm."""
    calls = unscaled_gradient_calls(graph, _loss_scale_variables(graph, step_signals(graph)))
    scaled = _scaled_losses(graph)
    result = {}
    for scope, ops in calls.items():
        if scope in scaled:
            continue
        for call in _each_call(ops):
            if any(op.name in converted for op in call) and not _reaches_an_update(call):
                result.update((op.name, scope) for op in call)
    return result


def _each_call(ops) -> List[List]:
    """The ops of a scope's ``tf.gradients`` calls, one list per call: ``ops`` whole, or where
    a second call reused the scope (seeds "grad_ys_0" and "grad_ys_0_1": a saliency map's
    call after ``import_meta_graph`` of a training graph), the ops computed from each
    call's seeds -- the training call's reach an update, the saliency map's do not."""
    calls: Dict[str, List] = {}
    for op in ops:
        seed = _GRADIENT_SEED.search(op.name)
        if seed:
            calls.setdefault(seed.group("again") or "", []).append(op)
    if len(calls) < 2:
        return [ops]
    inside = set(ops)
    return [sorted(reachable(seeds, lambda op: [c for t in op.outputs for c in t.consumers() if c in inside]),
                   key=lambda op: op.name) for seeds in calls.values()]


def from_a_loss_the_program_scales(tensors) -> bool:
    """Whether ``tensors`` are computed by a ``tf.gradients`` call whose loss the program
    scales itself (own_loss_scale.py: ``tf.gradients(loss * 1024., ...)``)."""
    scopes = tuple(scope + "/" for scope in _scaled_losses(tensors[0].graph))
    return bool(scopes) and any(op.name.startswith(scopes) for op in ancestors(tensors))


def seeded_by_the_program(tensors) -> bool:
    """Whether ``tensors`` are computed by a ``tf.gradients`` call given ``grad_ys``: its
    seeds are the program's (an Identity of them), not ones (a Fill) -- LambdaRank's
    ``tf.gradients(scores, params, grad_ys=lambdas)`` differentiates no loss."""
    return any(_GRADIENT_SEED.search(op.name) and op.type == "Identity" for op in ancestors(tensors))


def _scaled_losses(graph) -> Dict[str, List]:
    """``{scope: losses}``: the ``tf.gradients`` calls of ``graph`` whose losses the program
    scales itself (own_loss_scale.py), and those losses.  Every one the seed reaches must
    be: the gradient of a sum passes the seed on to its terms, and ``cls + 10. * coral``
    (a term's weight) scales one term, not the loss."""
    scaled = {}
    for scope in _call_scopes(graph):
        losses = _losses_of(graph, scope)
        if losses and all(own_scale(loss) for loss in losses):
            scaled[scope] = losses
    return scaled


def unscaled_gradient_calls(graph, scales) -> Dict[str, List]:
    """``{scope: ops}``: the ``tf.gradients`` calls of ``graph`` (each seeded under its own
    scope, "gradients", "gradients_1", ...) none of whose ops reads any of ``scales``, the
    loss scales' ops, directly or not: gradients of a loss no loss scale multiplies."""
    operations = graph.get_operations()
    scopes = _call_scopes(graph)
    if not scopes:
        return {}
    scaled = downstream_of(graph, scales)
    calls = {scope: [op for op in operations if op.name.startswith(scope + "/")] for scope in scopes}
    return {scope: ops for scope, ops in calls.items() if not any(op in scaled for op in ops)}


def _call_scopes(graph) -> List[str]:
    """The scopes of ``graph``'s ``tf.gradients`` calls ("gradients", "gradients_1", ...)."""
    return sorted({op.name[:op.name.rindex("/grad_ys_")] for op in graph.get_operations()
                   if _GRADIENT_SEED.search(op.name)})


def _losses_of(graph, scope: str) -> List:
    """The ops whose outputs the ``tf.gradients`` call under ``scope`` differentiates: those
    its seeds are read by the gradients of (``<scope>/<loss>_grad/...``)."""
    losses = []
    for op in graph.get_operations():
        if op.name.startswith(scope + "/grad_ys_"):
            for reader in (c for t in op.outputs for c in t.consumers()):
                name = reader.name[len(scope) + 1:]
                if reader.name.startswith(scope + "/") and "_grad/" in name:
                    try:
                        losses.append(graph.get_operation_by_name(name[:name.index("_grad/")]))
                    except KeyError:
                        pass
    return losses


def _reaches_an_update(ops) -> bool:
    """Whether the values of ``ops`` flow into an optimizer's update, an assignment to a
    trainable variable or to a gradient accumulator (gradient_accumulation.py: a step
    applies what it holds), or a loss-scaled optimizer's finite check, other than past a
    ``stop_gradient`` or out of a ``while_loop(..., back_prop=False)`` (a Langevin
    sampler's).  A metric's counts (``tf.metrics.accuracy`` of an FGSM attack) and an
    attack's perturbation kept in a non-trainable variable update no model."""
    def readers(op):
        if op.type in _GRADIENT_STOPS or _leaves_a_loop_without_backprop(op):
            return []
        return [c for t in op.outputs for c in t.consumers()]

    reached = reachable(ops, readers)
    updated = None
    for op in reached:
        if _UPDATE_OP.match(op.type) or _FINITE_CHECK in op.name:
            return True
        if op.type in _ASSIGN_OPS and op.inputs:
            if updated is None:
                updated = {v.op.name for v in op.graph.get_collection("trainable_variables")}
                updated |= gradient_accumulators(op.graph)
            if variable_op(op.inputs[0]).name in updated:
                return True
    return False


def _leaves_a_loop_without_backprop(op) -> bool:
    """Whether ``op`` is an Exit of a TF1 while loop built with ``back_prop=False``: no
    gradient flows back through it, as through a ``stop_gradient``."""
    if op.type not in ("Exit", "RefExit"):
        return False
    context = op._get_control_flow_context()  # pylint: disable=protected-access
    return getattr(context, "back_prop", True) is False


def _loss_scale_variables(graph, signals) -> List:
    """The loss scales' variable ops: what a loss-scaled step's gradients are computed from."""
    return [v.op for v in loss_scale_variables(signals) if v.op.graph is graph]


class UnscaledTrainingWatch:
    """Per session: the first run that computes an unscaled update says so (module docstring)."""

    def __init__(self):
        self._updates: Dict[str, str] = {}     # update op name -> op type
        self._imported: set = set()            # those of them a MetaGraph import built
        self._unguarded: Dict[str, str] = {}   # assign op name -> variable name
        self._backprops: Dict[str, str] = {}   # unscaled tf.gradients op name -> scope
        self._version = None
        self._checked: set = set()             # fetch sets already found to compute none
        self._said = False
        self._said_unguarded = False
        self._said_backprop = False
        self._guarded = frozenset()

    def graph_changed(self, graph, dtype: str, converted=frozenset, unguarded=None,
                      guarded=frozenset()) -> None:
        """``converted()``: the names of the nodes the session's rewrite converts (asked for
        only when the graph changed: every run calls this); ``unguarded``: ``unguarded_writes``
        of the graph, where the caller found them already; ``guarded``: those of them the
        session makes write finite entries only."""
        self._guarded = guarded
        if graph.version == self._version:
            return
        self._version = graph.version
        updates = [] if self._said else unscaled_updates(graph, dtype)
        self._updates = {op.name: op.type for op in updates}
        # built by no Python of this process: imported with a MetaGraph (a float32 run's train op)
        self._imported = {op.name for op in updates if not _built_here(op)}
        if self._said_unguarded:
            self._unguarded = {}
        else:
            self._unguarded = dict(unguarded) if unguarded is not None else unguarded_writes(graph)
        self._backprops = ({} if self._said_backprop or dtype != "float16"
                           else unscaled_backprops(graph, converted()))
        self._checked.clear()

    def before_run(self, elements) -> None:
        """``elements``: the run's fetches in the graph it runs (the update ops keep their names)."""
        watched = {**(self._updates if not self._said else {}),
                   **(self._unguarded if not self._said_unguarded else {}),
                   **(self._backprops if not self._said_backprop else {})}
        if not watched:
            return
        key = frozenset(getattr(e, "name", str(e)) for e in elements)
        if key in self._checked:
            return
        computed = {op.name for op in ancestors(elements)}
        unguarded = sorted(computed & self._unguarded.keys()) if not self._said_unguarded else []
        if unguarded:
            self._said_unguarded = True
            self._say_unguarded(unguarded)
        backprop = sorted(computed & self._backprops.keys()) if not self._said_backprop else []
        if backprop:
            self._said_backprop = True
            self._say_backprop(sorted({self._backprops[name] for name in backprop}))
        computed = sorted(computed & self._updates.keys()) if not self._said else []
        if not computed:
            if not unguarded and not backprop:
                self._checked.add(key)
            return
        self._said = True
        if computed[0] in self._imported:
            log_once(
                "tfamp_rewrite: this run trains in float16 without loss scaling: its %d update op(s) "
                "(e.g. '%s', %s) come from a graph imported as it was saved (import_meta_graph of a "
                "float32 run), whose optimizer no loss scaling wraps, so float16 gradients below "
                "6e-8 flush to zero. Build the model and its optimizer in this program (automatic "
                "loss scaling wraps it) and restore the checkpoint into them, or keep the backward "
                "pass float32 with TFAMP_REWRITE_NODES_TO_EXCLUDE='^gradients/' (said once)"
                % (len(computed), computed[0], self._updates[computed[0]]))
            return
        log_once(
            "tfamp_rewrite: this run trains in float16 without loss scaling: none of its %d update "
            "op(s) (e.g. '%s', %s) comes from a loss-scaled optimizer, so float16 gradients below "
            "6e-8 flush to zero. Automatic loss scaling (TF_ENABLE_AUTO_MIXED_PRECISION=1) covers "
            "the tf.compat.v1.train optimizers built while it is on; wrap a Keras optimizer in %s, "
            "another in tfamp_rewrite.LossScaleOptimizer%s."
            % (len(computed), computed[0], self._updates[computed[0]], loss_scale_optimizer_name(),
               " and take the gradients from its compute_gradients (an optimizer whose own "
               "apply_gradients assigns the new values, as BERT's does, is not wrapped "
               "automatically); an update written by hand from tf.gradients (gradient ascent "
               "on an input variable) needs no optimizer: multiply the loss by a constant "
               "before tf.gradients and divide the step by it" if self._updates[computed[0]] in _ASSIGN_OPS
               else ""))

    @staticmethod
    def _say_backprop(scopes: List[str]) -> None:
        """``scopes``: the ``tf.gradients`` calls' scopes the run computes (a Hessian-vector
        product's "gradients" and "gradients_1")."""
        log_once(
            "tfamp_rewrite: this run computes tf.gradients of a loss no loss scale multiplies "
            "(%s) in float16, and uses them as values, not as an optimizer's update: gradient "
            "entries below 6e-8 flush to zero there (an input gradient for FGSM or a saliency "
            "map loses its small entries), and those below 6.1e-5 are subnormal, rounded to "
            "fewer bits (a mean over more than 16384 samples seeds 1/n there: a Monte Carlo "
            "greek is biased by a part in a thousand). Keep %s float32 with "
            "TFAMP_REWRITE_NODES_TO_EXCLUDE='%s' (the forward pass stays half), or multiply "
            "the loss by a constant before tf.gradients (1024, or less where the gradients "
            "times it would pass 65504; per-example gradients of a batch mean span more than "
            "any constant brings into range), and divide the results by it in numpy, or not at "
            "all where only their direction counts (FGSM's sign, a normalised map): divided in "
            "float16, the smallest entries flush again. "
            "Gradients that stay zero at any constant come from rounding, not flushing: a "
            "perturbation of the input below float16's resolution (VAT's x + 1e-6 * d) rounds "
            "away where a half node reads the sum, and no loss scale brings it back -- keep that "
            "reader float32 (TFAMP_REWRITE_NODES_TO_EXCLUDE) (said once)." % (
                ", ".join(repr(scope) for scope in scopes),
                "that call" if len(scopes) == 1 else "those calls",
                ",".join("^%s/" % scope for scope in scopes)))

    def _say_unguarded(self, names: List[str]) -> None:
        if names[0] in self._guarded:
            what = ("so the session writes only its finite entries (an entry the inf/nan would "
                    "reach keeps its value; the finite ones are written, skipped step or not), "
                    "where the inf/nan would otherwise stay in the variable for good")
        else:
            what = ("and it writes them into the variable for good (the skip guards only "
                    "apply_gradients)")
        log_once(
            "tfamp_rewrite: %r writes to trainable variable %r a value computed from loss-scaled "
            "gradients, without waiting on the step's finite flag: on a skipped step those "
            "gradients are inf/nan, %s%s. Compute the value from finite gradients only, e.g. "
            "g = tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)) (the step is skipped "
            "anyway)." % (names[0], self._unguarded[names[0]], what,
                          " -- and %d more such write(s)" % (len(names) - 1) if len(names) > 1 else ""))


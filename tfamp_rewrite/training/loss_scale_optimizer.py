"""``LossScaleOptimizer``: loss scaling around any ``tf.compat.v1.train.Optimizer``.

One training step, as the graph computes it::

    scale = loss_scale()                                         # compute_gradients
    grads = opt.compute_gradients(loss * scale)
    grads, all_finite = unscale_and_check_finite(grads, 1 / scale)
    ...                                # the caller or an outer wrapper may transform grads
    if grads are not the ones compute_gradients returned:       # apply_gradients
        _, all_finite = unscale_and_check_finite(grads, 1.0)     # check what is applied
    update_op, should_apply = loss_scale.update(all_finite)      # outside any cond
    apply_op = cond(should_apply, opt.apply_gradients, no_op)    # the only data-dependent branch
    return group(apply_op, update_op)

A skipped step changes no variable, no slot and no ``global_step``; only the loss scale
moves.  The finite flag and the loss-scale update never sit inside the cond, so no
collective communication can end up in a branch that ranks might take differently.

Wrapping orders (Horovod's ``hvd.DistributedOptimizer``, TF's ``SyncReplicasOptimizer``):

* ``hvd.DistributedOptimizer(LossScaleOptimizer(opt))``: Horovod allreduces the unscaled
  gradients this optimizer's ``compute_gradients`` returns; ``apply_gradients`` then gets
  the reduced tensors, checks those, and every rank takes the same branch.
* ``LossScaleOptimizer(hvd.DistributedOptimizer(opt))``: Horovod's ``compute_gradients``,
  called here, allreduces the scaled gradients, so the check sees reduced values; Horovod's
  ``apply_gradients`` has no collective and is what runs inside the cond.
* ``SyncReplicasOptimizer(LossScaleOptimizer(opt), ...)``: the chief checks the
  aggregated gradients.  A skipped step still advances ``global_step`` here, because
  SyncReplicasOptimizer paces its workers with ``global_step`` values and its
  accumulators have counted the step anyway (see ``_taken_from_accumulators``).
* Rejected with ``ValueError``: a ``LossScaleOptimizer`` around a ``SyncReplicasOptimizer``
  or around Horovod's Adasum optimizer (``op=hvd.Adasum``): both communicate inside
  ``apply_gradients``, which would put that communication in the skip branch.  Also
  around an ``hvd.DistributedOptimizer`` with ``backward_passes_per_step > 1``: between
  its allreduces it returns this rank's own gradients, so each rank would skip and
  rescale on its own.  Wrap them around the ``LossScaleOptimizer`` instead.

Programs that compute gradients themselves (``tf.gradients(loss, vars)``, then
``apply_gradients``) scale with Keras' names: ``grads = opt.get_unscaled_gradients(
tf.gradients(opt.get_scaled_loss(loss), vars))``.  ``apply_gradients`` warns once when its
gradients do not depend on any loss scale this optimizer handed out: they were computed from
the unscaled loss, so small half gradients flushed to zero before anything could skip a step.

``get_slot``, ``get_slot_names`` and ``variables`` answer for the wrapped optimizer (the
last adds the loss-scale variables), and every attribute that neither this class nor
``tf.compat.v1.train.Optimizer`` defines is forwarded to it, so ``opt._learning_rate``,
``opt._lr`` or a Horovod hook such as ``register_local_var`` reach it through the wrapper.
"""
from __future__ import annotations

import collections
import contextlib
import threading
from typing import Optional

import tensorflow as tf

from ..fused_op.op import unscale_and_check_finite
from . import keras_compat, step_signals
from . import loss_scale as loss_scale_module
from .devices import log_once
from .op_walks import computed_only_from, reachable
from .python_backprop import unscale_around_python
from .unscaled_training import (
    GRADIENT_SCOPE,
    from_a_loss_the_program_scales,
    seeded_by_the_program,
    unscaled_gradient_calls,
)
from .variable_check import VARIABLE_OPS

_tf = tf.compat.v1

# Wrappers that communicate in apply_gradients and so must stay outside the skip branch.
_APPLY_TIME_COMMUNICATORS = {
    "SyncReplicasOptimizer": "it aggregates gradients across workers in apply_gradients",
    "_DistributedAdasumOptimizer": "Horovod's Adasum allreduces in apply_gradients",
}

# The graph collection holding each loss-scale tensor compute_gradients multiplied a loss by
# (the same tensor unscales its gradients), so a reader -- the precision doctor -- can fetch
# the exact scale a step used.
LOSS_SCALE_COLLECTION = "tfamp_rewrite_loss_scale"

# The name scope the loss scaling builds its own ops in: built in the caller's scope, they
# took names such as ``cond``, ``Identity`` and ``add`` first, and the program's later ops of
# those names came out ``cond_1``, ``Identity_2``: not the names its float32 run has, which a
# program fetching or exporting tensors by name relies on.
OWN_OPS_SCOPE = "amp_loss_scaling"

# Depth of LossScaleOptimizer calls into the optimizers they wrap, per thread.
_delegation = threading.local()


def delegating() -> bool:
    """True while a LossScaleOptimizer is calling the optimizer it wraps (on this thread).

    Optimizers that scale their loss automatically (``activation``) must not scale again then.
    """
    return getattr(_delegation, "depth", 0) > 0


@contextlib.contextmanager
def delegation():
    """Marks, on this thread, a loss-scaling wrapper calling the optimizer it wraps."""
    _delegation.depth = getattr(_delegation, "depth", 0) + 1
    try:
        yield
    finally:
        _delegation.depth -= 1


# The gradients compute_gradients returned last, the finite flag that covers them, and the
# (unscaled) loss they were computed from, or None (get_unscaled_gradients).
_CheckedGradients = collections.namedtuple("_CheckedGradients", ["grads", "all_finite", "loss"])


def _own_ops():
    """A name scope for ops the loss scaling adds (unique per call, under the caller's)."""
    return _tf.name_scope(OWN_OPS_SCOPE)


def _wrapped_chain(opt):
    """``opt`` and every optimizer it wraps, outermost first.

    Wrappers keep the optimizer they wrap in ``_optimizer`` (this class, TensorFlow's and
    Horovod's) or ``_opt`` (``SyncReplicasOptimizer``).  Only instance dictionaries are
    read, so no wrapper's attribute forwarding can answer for another.
    """
    seen = set()
    while opt is not None and id(opt) not in seen:
        seen.add(id(opt))
        yield opt
        attributes = getattr(opt, "__dict__", {})
        opt = attributes.get("_optimizer", attributes.get("_opt"))


def _check_wrappable(opt):
    """Raises ValueError unless loss scaling can be added around ``opt``."""
    # ValueError, not TypeError, for every bad `opt`: TensorFlow's contract here.
    outer = type(opt).__name__
    if not isinstance(opt, _tf.train.Optimizer):
        if keras_compat.is_keras_object(opt) and "LossScaleOptimizer" in outer:
            raise ValueError(
                f"Got a Keras {outer}, which already does loss scaling; use it as it is, or "
                "pass a tf.compat.v1.train optimizer to add tfamp_rewrite's loss scaling once."
            )
        if keras_compat.is_keras_object(opt):
            raise ValueError(
                "Expected a tf.compat.v1.train.Optimizer to add loss scaling to; got the Keras "
                f"optimizer {outer}. Keras optimizers have their own loss scaling: use "
                f"{keras_compat.loss_scale_optimizer_name()}, or pass a tf.compat.v1.train "
                "optimizer."
            )
        raise ValueError(  # noqa: TRY004
            f"Expected a tf.compat.v1.train.Optimizer to add loss scaling to; got {opt!r}."
        )
    for inner in _wrapped_chain(opt):
        kind = type(inner).__name__
        if "LossScaleOptimizer" in kind:
            raise ValueError(
                f"{outer} already does loss scaling (it is or wraps a {kind}); wrap an optimizer "
                "once: enable_mixed_precision_graph_rewrite(opt) and LossScaleOptimizer(opt) "
                "both return a wrapped optimizer, so pass them the unwrapped one."
            )
        if kind in _APPLY_TIME_COMMUNICATORS:
            raise ValueError(
                f"Cannot add loss scaling around {kind}: {_APPLY_TIME_COMMUNICATORS[kind]}, "
                "which would then run inside the skip-this-step branch. Wrap "
                f"{kind.lstrip('_')} around the LossScaleOptimizer instead."
            )
        if getattr(inner, "__dict__", {}).get("_agg_helper") is not None:  # Horovod's
            raise ValueError(
                f"Cannot add loss scaling around {kind} with backward_passes_per_step > 1: "
                "between its allreduces it returns this rank's own gradients, so ranks would "
                "skip steps and change their loss scales independently. Wrap "
                "hvd.DistributedOptimizer(..., backward_passes_per_step=N) around the "
                "LossScaleOptimizer instead."
            )


def _scaled_loss(loss, scale):
    """``loss * scale`` in the loss's dtype, read past a ``tf.Print`` of it (``_past_prints``);
    a callable loss stays a callable."""
    if callable(loss):
        def scaled():
            value = _past_prints(loss())
            return value * _tf.cast(scale, value.dtype)
        return scaled
    loss = _past_prints(loss)
    return loss * _tf.cast(scale, loss.dtype)


def _past_prints(tensor):
    """The value ``tf.Print`` ops on ``tensor`` pass through.  A Print's gradient is its
    input's, and float32 runs it only where the program fetches it: the scaling or a check
    reading the Print would print in every step's run (twice, with Grappler's arithmetic
    optimizer and an ``IsFinite`` reader)."""
    while tensor.op.type == "Print" and tensor.op.inputs[0].dtype == tensor.dtype:
        tensor = tensor.op.inputs[0]
    return tensor


def _same_gradients(first, second):
    """True if both lists hold the same gradient objects (order and Nones aside)."""
    def ids(grads):
        return sorted(id(g) for g in grads if g is not None)
    return ids(first) == ids(second)


_CLIPS = frozenset({"ClipByValue", "Minimum", "Maximum"})


def _warn_if_backprop_clips(backprop_ops) -> None:
    """Says once when the backprop of a scaled loss clips values to constant bounds: a
    gradient clipped inside ``tf.custom_gradient`` or a ``gradient_override_map`` sees it
    multiplied by the loss scale, so it clips where float32 would not, and the update,
    divided by the scale afterwards, shrinks by it.  A clip counts when what it clips is
    computed from the backprop's seed (a bound on a forward value, ``max(norm, 1e-6)``,
    sees no scale) and its bound from constants only (``clip_by_global_norm``'s
    ``1 / clip_norm`` included)."""
    backprop = set(backprop_ops)
    for op in backprop_ops:
        if (op.type in _CLIPS and op.outputs[0].dtype.is_floating
                and any(_constant(t) for t in op.inputs[1:]) and _from_the_seed(op.inputs[0], backprop)
                and not _normalized(op.inputs[0], backprop)):
            log_once(
                "tfamp_rewrite: the backprop of a loss-scaled loss clips values to constant bounds "
                "(%r, %s): a gradient clipped inside tf.custom_gradient or gradient_override_map is "
                "the scaled one there (the loss scale times larger), so the clip bites where float32 "
                "would not, and the update shrinks by the scale once unscaled. Clip the gradients "
                "compute_gradients returns instead, or leave the model's own gradient unclipped."
                % (op.name, op.type))
            return


def _with_python_unscaled(grads_and_vars, backprop_ops, scale):
    """``grads_and_vars`` after ``python_backprop.unscale_around_python``: said once."""
    backprop = set(backprop_ops)
    with _own_ops():
        rewired = unscale_around_python(backprop_ops, scale, lambda t: _from_the_seed(t, backprop))
    if not rewired:
        return grads_and_vars
    names = sorted({name.rsplit(":", 1)[0] for name in rewired})
    log_once("tfamp_rewrite: the backprop of a loss-scaled loss runs Python (%s%s): it is given the "
             "gradients divided by the loss scale, and its results are multiplied back, so the "
             "Python code computes on float32's values (a clip or threshold in it acts as in "
             "float32)" % (", ".join(repr(n) for n in names[:3]), ", ..." if len(names) > 3 else ""),
             key="python in a loss-scaled backprop")

    def rescaled(grad):
        if isinstance(grad, _tf.IndexedSlices) and grad.values.name in rewired:
            return _tf.IndexedSlices(rewired[grad.values.name], grad.indices, grad.dense_shape)
        return rewired.get(grad.name, grad) if isinstance(grad, _tf.Tensor) else grad
    return [(rescaled(g), v) for g, v in grads_and_vars]


_REDUCTIONS = frozenset({"Max", "Sum", "Mean", "EuclideanNorm"})
_NORMALIZED_WITHIN = 4  # ops up from a clip's input to the division that makes it scale-free
_SEEDS = frozenset({"Fill", "OnesLike"})  # what tf.gradients starts a backprop from
_CONSTANT_ARITHMETIC = frozenset({"Const", "Identity", "RealDiv", "Div", "Mul", "Reciprocal", "Cast",
                                  "Neg", "Sub", "AddV2", "Add"})


def _from_the_seed(tensor, backprop) -> bool:
    """Whether ``tensor`` is computed, within the ``backprop`` ops, from the seed of the
    gradient (a ``Fill`` of ones, or the ``grad_ys`` fed to it): it carries the scale."""
    if tensor.op not in backprop:
        return False
    within = reachable([tensor.op], lambda op: [t.op for t in op.inputs if t.op in backprop])
    return any(op.type in _SEEDS for op in within)


def _normalized(tensor, backprop) -> bool:
    """Whether ``tensor`` was divided by a reduction a few ops up, the numerator carrying
    the scale too (DoReFa's gradient quantizer clips ``g / max|g|``, then multiplies back):
    a clip of it bites the same at any loss scale.  ``1 / norm`` (clip_by_global_norm's
    factor) shrinks with the scale: not normalized."""
    level, seen = [tensor.op], set()
    for _ in range(_NORMALIZED_WITHIN):
        upstream = []
        for op in level:
            if op in seen:
                continue
            seen.add(op)
            if (op.type in ("RealDiv", "Div", "DivNoNan") and _reduction_within(op.inputs[1], 3)
                    and _from_the_seed(op.inputs[0], backprop)):
                return True
            upstream.extend(t.op for t in op.inputs)
        level = upstream
    return False


def _reduction_within(tensor, depth: int) -> bool:
    op = tensor.op
    if op.type in _REDUCTIONS:
        return True
    return depth > 0 and any(_reduction_within(t, depth - 1) for t in op.inputs[:2])


def _constant(tensor) -> bool:
    """Whether ``tensor`` is computed from constants only, by arithmetic (``1.0 / clip_norm``)."""
    return computed_only_from(tensor, lambda op: op.type == "Const",
                              lambda op: op.type in _CONSTANT_ARITHMETIC)


def _depends_on_any(tensors, ops, through_variables=True) -> bool:
    """True if an op in ``ops`` is among the ancestors of ``tensors``: through data and
    control inputs, and (``through_variables``) through variables -- an op assigning a
    variable (a gradient accumulator's ``assign_add(grad)``) counts as an ancestor of the
    variable's reads, although it may have run in an earlier ``Session.run``."""
    stack = [t.op for t in tensors]
    seen = set()
    writers = None
    while stack:
        op = stack.pop()
        if op in ops:
            return True
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
        if through_variables and op.type in VARIABLE_OPS:
            writers = _variable_writers(op.graph) if writers is None else writers
            stack.extend(writers.get(op, ()))
    return False


# Ops that write a variable from a value: Assign, AssignAdd, AssignSub, their resource forms
# (AssignVariableOp, ...) and the scatters.  Optimizers' Apply* ops are left out: a weight an
# optimizer updates does not make the loss computed from it scaled.
_WRITER_PREFIXES = ("Assign", "Scatter", "ResourceScatter")


def _variable_writers(graph):
    """``{variable op: [ops of graph assigning it]}``."""
    writers = collections.defaultdict(list)
    for op in graph.get_operations():
        if op.type.startswith(_WRITER_PREFIXES) and op.inputs and op.inputs[0].op.type in VARIABLE_OPS:
            writers[op.inputs[0].op].append(op)
    return writers


def _loss_finite(loss):
    """Whether ``loss`` (a tensor, or None) holds only finite values, as a bool scalar built
    beside the step; None where it cannot be fetched with the step's flag, or is no tensor.
    It reads the value a ``tf.Print`` of the loss passes on (``_past_prints``)."""
    if not isinstance(loss, _tf.Tensor) or not loss.dtype.is_floating or not _usable_here(loss):
        return None
    loss = _past_prints(loss)
    if not _usable_here(loss):
        return None
    return _tf.reduce_all(_tf.math.is_finite(loss), name="loss_is_finite")


def _usable_here(tensor) -> bool:
    """Whether ops built now may read ``tensor``: not one computed inside a TF1 while loop or
    cond branch (or a function) that the current context is not in -- gradients computed
    in a loop body and summed in its loop variables, applied after the loop."""
    graph = _tf.get_default_graph()
    if tensor.graph is not graph:
        return False
    context = tensor.op._get_control_flow_context()  # pylint: disable=protected-access
    return context is None or context is graph._get_control_flow_context()  # pylint: disable=protected-access


@contextlib.contextmanager
def _outside_the_callers_cond(grads):
    """Builds in the context around the program's TF1 cond branch that ``apply_gradients`` is
    called in, where ``grads`` were computed there and the cond's predicate is computed from
    them: a guard such as ``tf.cond(is_finite(norm), apply, no_op)`` then skips the update,
    but the finite check and the scale's update still run every step (the apply waits on
    them), so a scale too high for the first step comes down instead of overflowing every
    step after it, the guard never letting it fall."""
    graph = _tf.get_default_graph()
    context = graph._get_control_flow_context()  # pylint: disable=protected-access
    outer = getattr(context, "outer_context", None)
    inside_a_cond = context is not None and getattr(context, "IsCondContext", lambda: False)()
    if not inside_a_cond or not grads or any(
            t.op._get_control_flow_context() is not outer for t in grads):  # pylint: disable=protected-access
        yield
        return
    # a guard decides on the gradients; a cond applying every k-th step (accumulation,
    # Horovod's backward_passes_per_step) does not, and its skipped runs are no steps
    computed_from = reachable([context.pred.op], lambda op: [t.op for t in op.inputs])  # values only
    if not computed_from & {t.op for t in grads}:
        yield
        return
    graph._set_control_flow_context(outer)  # pylint: disable=protected-access
    try:
        yield
    finally:
        graph._set_control_flow_context(context)  # pylint: disable=protected-access


def _unscale_and_check_finite(grads, inv_scale):
    """``unscale_and_check_finite`` for any floating gradient, in stock ops a saved graph can
    hold (a rewriting session runs them as the fused op): the fused op takes half, float and
    bfloat16; a float64 one (a user's float64 variable) is unscaled in float64 apart, and its
    finite flag joins the others'."""
    wide = {i for i, g in enumerate(grads) if g is not None and _tensors_of([g])[0].dtype == _tf.float64}
    if not wide:
        return unscale_and_check_finite(grads, inv_scale, portable=True)
    unscaled, flags = list(grads), []
    if len(wide) < sum(g is not None for g in grads):
        narrow, flag = unscale_and_check_finite([None if i in wide else g for i, g in enumerate(grads)],
                                                inv_scale, portable=True)
        unscaled = [narrow[i] if narrow[i] is not None else g for i, g in enumerate(grads)]
        flags.append(flag)
    inv_scale = _tf.cast(inv_scale, _tf.float64)
    for i in sorted(wide):
        grad = grads[i]
        values = _tensors_of([grad])[0] * inv_scale
        flags.append(_tf.reduce_all(_tf.is_finite(values)))
        unscaled[i] = (_tf.IndexedSlices(values, grad.indices, grad.dense_shape)
                       if isinstance(grad, _tf.IndexedSlices) else values)
    return unscaled, flags[0] if len(flags) == 1 else _tf.reduce_all(_tf.stack(flags))


def _tensors_of(grads):
    """The tensors of a gradient list (an IndexedSlices' values), Nones left out."""
    return [getattr(g, "values", g) for g in grads if g is not None]


def _own_compute_gradients(optimizer) -> Optional[str]:
    """The name of the class of ``optimizer``'s that defines a ``compute_gradients`` of its
    own (PCGrad's, a DP optimizer's), or None when it is TensorFlow's."""
    for klass in type(optimizer).__mro__:
        if "compute_gradients" in vars(klass):
            module = getattr(klass, "__module__", "") or ""
            return None if module.startswith(("tensorflow", "tfamp_rewrite")) else klass.__name__
    return None


def _taken_from_accumulators(grads):
    """True if ``grads`` come from gradient accumulators (``SyncReplicasOptimizer``).

    Such a step was counted by the accumulators whether or not it is applied, and the
    tokens that pace the workers are ``global_step`` values: a skipped step must still
    advance ``global_step``, or every later gradient is dropped as stale and all
    workers wait for ever.
    """
    return any(
        g is not None and g.op.type.endswith("AccumulatorTakeGradient") for g in grads
    )


class LossScaleOptimizer(_tf.train.Optimizer):
    """Wraps ``opt`` so that its loss is scaled and non-finite steps are skipped.

    Args:
      opt: a ``tf.compat.v1.train.Optimizer`` that does no loss scaling yet.
      loss_scale: ``'dynamic'`` (default), a number >= 1 for a fixed scale, or a
        ``DynamicLossScale`` / ``FixedLossScale``.

    Raises:
      ValueError: ``opt`` is not such an optimizer, already does loss scaling,
        communicates in ``apply_gradients``, or ``loss_scale`` is not one of the above.

    ``compute_gradients`` returns unscaled gradients, as an unwrapped optimizer would, so
    clipping between ``compute_gradients`` and ``apply_gradients`` works as usual.

    Object-based checkpoints (``tf.compat.v1.train.Checkpoint(optimizer=...)``) save what
    the wrapped optimizer's would, under the same keys (slots, and non-slot variables such
    as Adam's ``beta1_power``), plus the loss scale's ``current_loss_scale`` and
    ``good_steps``.  Under automatic loss scaling the user holds the wrapped optimizer, so
    the loss scale's variables are its dependencies instead (``_state_owner``).
    """

    def __init__(self, opt, loss_scale="dynamic"):
        _check_wrappable(opt)
        scale = loss_scale_module.get(loss_scale)
        if scale is None:
            raise ValueError(
                "LossScaleOptimizer needs a loss scale; got None. Pass 'dynamic', a number >= 1 "
                "or a loss scale object, or use the unwrapped optimizer for no loss scaling."
            )
        super().__init__(getattr(opt, "_use_locking", False), opt.get_name())
        self._optimizer = opt
        self._loss_scale = scale
        self._state_owner = self  # whose checkpoint dependencies the loss scale's variables are
        self._checked = None
        self._scales_handed_out = set()  # the ops of every scale tensor a loss was multiplied by
        # The wrapped optimizer's methods this one calls; automatic loss scaling points them at
        # tf.compat.v1.train.Optimizer's own, so a subclass's override (which called them
        # through super()) is not run a second time on scaled values.
        self._inner_methods = {}

    @property
    def loss_scale(self):
        """The ``LossScale`` this optimizer uses; call it for the current value."""
        return self._loss_scale

    def _scale_value(self):
        """The loss scale's current value; its variables (created in the default graph on
        first use) become checkpoint dependencies of ``_state_owner``."""
        value = self._loss_scale()
        for variable in self._loss_scale.variables():
            self._track_state(variable.op.name.rsplit("/", 1)[-1], variable, self._state_owner)
        return value

    @staticmethod
    def _track_state(name, variable, owner):
        """Makes ``variable`` ``owner``'s checkpoint dependency ``name`` in its graph.

        As a ``tf.compat.v1.train.Optimizer`` tracks Adam's ``beta1_power``: per graph, in
        ``_non_slot_dict``, so an Estimator's new graph per call does not collide with the
        last, and a restore requested before the variable exists reaches it."""
        key = (name, variable.graph)
        if owner._non_slot_dict.get(key) is not variable:
            owner._non_slot_dict[key] = variable
            owner._handle_deferred_dependencies(name=name, trackable=variable)

    def _track_wrapped_state(self):
        """The wrapped optimizer's non-slot variables in the default graph become this one's
        checkpoint dependencies, under their own names (its slots are found through
        ``get_slot``)."""
        if self._state_owner is self._optimizer:
            return
        graph = _tf.get_default_graph()
        for (name, owner_graph), variable in list(getattr(self._optimizer, "_non_slot_dict", {}).items()):
            if owner_graph is graph:
                self._track_state(name, variable, self)

    def _inner(self, name):
        """The wrapped optimizer's method ``name`` (see ``_inner_methods``)."""
        return self._inner_methods.get(name) or getattr(self._optimizer, name)

    def _current_scale(self):
        """The loss scale as a tensor, recorded as one a loss was scaled with."""
        scale = self._scale_value()
        _tf.add_to_collection(LOSS_SCALE_COLLECTION, scale)
        self._scales_handed_out.add(scale.op)
        return scale

    def get_scaled_loss(self, loss):
        """``loss`` times the current loss scale (a callable loss stays callable).

        For programs that differentiate themselves: ``tf.gradients(opt.get_scaled_loss(loss),
        vars)``, then ``get_unscaled_gradients`` (Keras' ``LossScaleOptimizer`` names).
        """
        with _own_ops():
            return _scaled_loss(loss, self._current_scale())

    def get_unscaled_gradients(self, grads):
        """``grads`` (tensors, IndexedSlices or None) divided by the current loss scale.

        ``apply_gradients`` of exactly these reuses their finite check.
        """
        grads = list(grads)
        with _own_ops():
            scale = self._scale_value()
            unscaled, all_finite = _unscale_and_check_finite(grads, 1.0 / scale)
        self._checked = _CheckedGradients(tuple(unscaled), all_finite, None)
        return list(unscaled)

    def compute_gradients(
        self,
        loss,
        var_list=None,
        gate_gradients=_tf.train.Optimizer.GATE_OP,
        aggregation_method=None,
        colocate_gradients_with_ops=False,
        grad_loss=None,
    ):
        """The wrapped optimizer's gradients of ``loss * scale``, divided by the scale."""
        with _own_ops():
            scale = self._current_scale()
            scaled_loss = _scaled_loss(loss, scale)
        graph = _tf.get_default_graph()
        before = len(graph.get_operations())
        with delegation():
            grads_and_vars = list(self._inner("compute_gradients")(
                scaled_loss,
                var_list=var_list,
                gate_gradients=gate_gradients,
                aggregation_method=aggregation_method,
                colocate_gradients_with_ops=colocate_gradients_with_ops,
                grad_loss=grad_loss,
            ))
        backprop = graph.get_operations()[before:]
        _warn_if_backprop_clips(backprop)
        grads_and_vars = _with_python_unscaled(grads_and_vars, backprop, scale)
        grads, variables = [g for g, _ in grads_and_vars], [v for _, v in grads_and_vars]
        if all(g is None for g in grads):  # minimize raises TensorFlow's "No gradients provided"
            return grads_and_vars
        with _own_ops():
            unscaled, all_finite = _unscale_and_check_finite(grads, 1.0 / scale)
        self._checked = _CheckedGradients(tuple(unscaled), all_finite, None if callable(loss) else loss)
        return list(zip(unscaled, variables))

    def scaled(self, grads) -> bool:
        """Whether ``grads`` were computed from a loss this optimizer scaled (its
        ``compute_gradients``', or through ``get_scaled_loss``)."""
        tensors = _tensors_of(grads)
        return bool(tensors) and _depends_on_any(tensors, self._scales_handed_out)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Applies the (unscaled) gradients if they are all finite; updates the loss scale.

        Returns one op, also put in the TRAIN_OP collection; on a non-finite step it
        leaves variables, slots and ``global_step`` unchanged (except that
        ``global_step`` advances under ``SyncReplicasOptimizer``, see the module docstring).
        """
        if _tf.distribute.has_strategy():
            raise RuntimeError(
                "LossScaleOptimizer does not run under a tf.distribute strategy; scale out "
                "with Horovod's DistributedOptimizer (either wrap order) or "
                "SyncReplicasOptimizer around the LossScaleOptimizer."
            )
        grads_and_vars = tuple(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        if all(g is None for g in grads):  # TensorFlow's own "No gradients provided" ValueError
            with delegation():
                return self._inner("apply_gradients")(grads_and_vars, global_step, name)
        name = name or self.get_name()
        # Inside the cond the name scope gains "cond/" (TF1) or starts afresh (a cond_v2
        # branch), and variables the wrapped optimizer creates there (Adam's beta1_power)
        # take it: under the caller's scope they are named, and checkpointed, as in float32.
        callers_scope = _tf.get_default_graph().get_name_scope()
        with _own_ops():
            with _outside_the_callers_cond(_tensors_of(grads)):
                all_finite, loss = self._all_finite(grads)
                # The gradients were unscaled with the value this update replaces: read it first
                # (and once more for whoever watches the steps, before the update).
                with _tf.control_dependencies([g.op for g in grads if g is not None]):
                    scale_used = self._scale_value()
                    with _tf.control_dependencies([scale_used.op]):
                        update_op, should_apply = self._loss_scale.update(all_finite)
                exported = step_signals.outside_tf1_conds([all_finite, scale_used])
                loss_finite = _loss_finite(loss) if not exported else None
            step_signals.register(scale_used.graph, step_signals.StepSignal(
                all_finite=all_finite, scale=scale_used, loss_scale=self._loss_scale,
                loss_finite=loss_finite,
                should_apply=None if isinstance(should_apply, bool) else should_apply,
                exported=tuple(exported) if exported else None, computed_by=update_op,
                variables=tuple(v.op.name for g, v in grads_and_vars if g is not None)))

            def apply():
                with _tf.name_scope(callers_scope + "/" if callers_scope else None), delegation():
                    return self._inner("apply_gradients")(grads_and_vars, global_step, name + "-wrapped")

            def skip():
                if global_step is not None and _taken_from_accumulators(grads):
                    return _tf.assign_add(global_step, 1).op
                return _tf.no_op()

            train_ops = _tf.get_collection_ref(_tf.GraphKeys.TRAIN_OP)
            earlier_train_ops = list(train_ops)
            if isinstance(should_apply, bool):  # a fixed scale: there is nothing to decide
                apply_op = apply() if should_apply else skip()
            else:
                apply_op = _tf.cond(should_apply, apply, skip)
        train_op = _tf.group(apply_op, update_op, name=name)
        self._track_wrapped_state()
        # The wrapped optimizer registered its own op, which may sit inside the cond where
        # nothing outside can fetch it (a MetaGraph would not even import); register ours.
        train_ops[:] = earlier_train_ops + [train_op]
        return train_op

    def _all_finite(self, grads):
        """``(flag, loss)``: the finite flag for ``grads``, and the loss they were computed from
        in the same run (or None).  The flag is reused if compute_gradients produced exactly
        them, and-ed with it if they were computed from them in the same run (clipping can make
        an inf finite). Gradients read from accumulators are checked as they are: and-ing them
        with compute_gradients' flag would recompute the loss, and need its feeds or pull
        another batch, in the run that applies the accumulated gradients."""
        checked = self._checked
        if checked is not None and _same_gradients(checked.grads, grads):
            return checked.all_finite, checked.loss
        # A variable given as the gradient (gpt-2's AccumulatingOptimizer) is checked as read.
        grads = [_tf.convert_to_tensor(g) if isinstance(g, _tf.Variable) else g for g in grads]
        self._warn_if_unscaled(grads)
        _, all_finite = _unscale_and_check_finite(grads, 1.0)
        if (checked is not None and _usable_here(checked.all_finite)
                and _depends_on_any(_tensors_of(grads), {t.op for t in _tensors_of(checked.grads)},
                                    through_variables=False)):
            return _tf.logical_and(all_finite, checked.all_finite), checked.loss
        return all_finite, None

    def _warn_if_fed_from_unscaled_gradients(self, graph) -> None:
        """Gradients fed in (placeholders; computed by no tf.gradients): said once where the
        graph also computes ``tf.gradients`` of a loss no scale multiplied -- what a policy
        gradient's buffers are filled from, run by run.  Fed from a loss-scaled
        ``compute_gradients``, or from numpy (an evolution strategy), is fine."""
        scales = {t.op for t in _tf.get_collection(LOSS_SCALE_COLLECTION)} | self._scales_handed_out
        unscaled = sorted(unscaled_gradient_calls(graph, scales))
        if unscaled:
            log_once(
                "tfamp_rewrite: apply_gradients got gradients fed from outside the graph, and the "
                "graph computes tf.gradients of a loss no loss scale multiplied (%r): if those are "
                "what is fed, small float16 gradients flushed to zero there, before any loss "
                "scaling. Compute them with opt.compute_gradients(loss) and feed those instead."
                % unscaled[0])

    def _warn_if_unscaled(self, grads) -> None:
        """Says once that ``grads`` were computed from a loss no scale multiplied."""
        tensors = _tensors_of(grads)
        if not tensors or _taken_from_accumulators(grads):  # accumulated: scaled upstream, elsewhere
            return
        if _depends_on_any(tensors, self._scales_handed_out):
            return
        graph = tensors[0].graph
        backprop = {op for op in graph.get_operations() if GRADIENT_SCOPE.search(op.name)}
        if not _depends_on_any(tensors, backprop):  # through accumulators' writers too
            self._warn_if_fed_from_unscaled_gradients(graph)
            return
        if from_a_loss_the_program_scales(tensors):  # tf.gradients(loss * 1024.): scaled already
            return
        others = {t.op for t in _tf.get_collection(LOSS_SCALE_COLLECTION)} - self._scales_handed_out
        if others and _depends_on_any(tensors, others):
            log_once(
                "tfamp_rewrite: apply_gradients got gradients another optimizer's loss scale "
                "multiplied: the steps it skips lower this optimizer's scale, not that one, so "
                "they recover only as that optimizer's own skipped steps lower it. Compute and "
                "apply the gradients with the same optimizer.")
            return
        named = "'%s' (%s)" % (self._optimizer.get_name(), type(self._optimizer).__name__)
        own = _own_compute_gradients(self._optimizer)
        if own is not None:
            log_once(
                "tfamp_rewrite: apply_gradients of %s got gradients computed from an unscaled loss: "
                "%s.compute_gradients is the program's own and does not call Optimizer."
                "compute_gradients, which the loss scaling multiplies the loss in, so loss "
                "scaling cannot keep small float16 gradients from flushing to zero; only "
                "non-finite steps are skipped. Have it compute them with super().compute_"
                "gradients(loss, ...) (or the wrapped optimizer's), or keep the nodes whose "
                "gradients flush float32 with TFAMP_REWRITE_NODES_TO_EXCLUDE" % (named, own),
                key="unscaled loss: own compute_gradients of %s" % named)
            return
        if seeded_by_the_program(tensors):  # a vector-Jacobian product: there is no loss
            log_once(
                "tfamp_rewrite: apply_gradients of %s got gradients tf.gradients computed from "
                "seeds of the program's (grad_ys=...), which no loss scale multiplies, so small "
                "float16 gradients flush to zero; only non-finite steps are skipped. The loss "
                "with those gradients is tf.reduce_sum(ys * tf.stop_gradient(grad_ys)): give "
                "it to opt.compute_gradients (or opt.minimize), which scales it" % named)
            return
        # once per optimizer: an architecture search's child and controller each apply their own
        log_once(
            "tfamp_rewrite: apply_gradients of %s got gradients computed from an unscaled loss "
            "(tf.gradients(loss, ...) rather than compute_gradients), so loss scaling cannot "
            "keep small float16 gradients from flushing to zero; only non-finite steps are "
            "skipped. Use opt.compute_gradients(loss) (with several optimizers, each its own: "
            "opt.compute_gradients(loss, var_list=the variables it applies)), or with a "
            "LossScaleOptimizer grads = opt.get_unscaled_gradients(tf.gradients("
            "opt.get_scaled_loss(loss), vars))." % named)

    def get_slot(self, var, name):
        return self._optimizer.get_slot(var, name)

    def _create_or_restore_slot_variable(self, slot_variable_position, slot_name, variable):
        # A checkpoint restores the slots it found through get_slot here: the wrapped
        # optimizer creates them, so it restores them (now, or when it creates them).
        return self._optimizer._create_or_restore_slot_variable(slot_variable_position, slot_name, variable)

    def get_slot_names(self):
        return self._optimizer.get_slot_names()

    def variables(self):
        """The wrapped optimizer's variables and the loss scale's, in the default graph."""
        with delegation():
            wrapped = self._inner("variables")()  # holds the loss scale's where it is _state_owner
        return wrapped + [v for v in self._loss_scale.variables() if not any(v is w for w in wrapped)]

    def __getattr__(self, name):
        # Reached only for names neither this class nor tf.compat.v1.train.Optimizer has.
        # Dunders and Trackable's own `_self_*` state belong to this object, never the inner.
        optimizer = self.__dict__.get("_optimizer")
        if optimizer is None or name.startswith(("__", "_self_")):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(optimizer, name)

"""Loss scales: the number the loss is multiplied by, and how it changes from step to step.

A loss scale is called to get its current value (a float32 scalar tensor in the caller's
graph) and updated once per training step with the step's ``all_finite`` flag, the one
``unscale_and_check_finite`` computes.  ``update`` returns ``(update_op, should_apply)``
as TensorFlow's ``LossScale.update`` does, except that it takes the finite flag instead of
the gradients: the check is fused with the unscaling and is never done twice.

* ``FixedLossScale(value)``: always ``value``; every step is applied (as in TensorFlow,
  a non-finite step is not skipped with a fixed scale).
* ``DynamicLossScale(...)``: TensorFlow's dynamic rule plus a ``min_loss_scale`` floor;
  its state is two variables per graph, created lazily in the graph that first uses
  them (the graph of the loss, which under an Estimator is not the graph that was
  current when the optimizer was built).
* ``get(identifier)``: ``'dynamic'``, a number, an instance or None, with TensorFlow's
  rules.

The update rule itself is ``next_dynamic_loss_scale``, a pure function that runs on
numpy values as well as on graph tensors.
"""
from __future__ import annotations

import collections
import math
import numbers
import os
import types
import weakref

import numpy as np
import tensorflow as tf

_tf = tf.compat.v1

# The graph counterparts of the numpy functions next_dynamic_loss_scale uses.
_GRAPH_OPS = types.SimpleNamespace(
    where=_tf.where,
    maximum=_tf.maximum,
    isfinite=_tf.math.is_finite,
    logical_and=_tf.logical_and,
    logical_not=_tf.logical_not,
    zeros_like=_tf.zeros_like,
    float32=lambda value: _tf.constant(value, _tf.float32),
)


def next_dynamic_loss_scale(
    scale, good_steps, all_finite, *, increment_period, multiplier, min_loss_scale, xp=np
):
    """Returns ``(new_scale, new_good_steps)`` after one step of dynamic loss scaling.

    ``scale`` is float32, ``good_steps`` int64 and ``all_finite`` bool; ``xp`` is the
    array namespace the rule runs on (numpy by default; the graph uses TF ops with
    the same names).  The rule, with every comparison in float32 as on the device::

        if all_finite:
            good_steps += 1
            if good_steps >= increment_period:
                if isfinite(scale * multiplier):
                    scale = scale * multiplier
                good_steps = 0
        else:
            scale = max(scale / multiplier, min_loss_scale)
            good_steps = 0

    It is TensorFlow's ``DynamicLossScale.update`` with the floor of 1 generalised to
    ``min_loss_scale``; both branches are computed and selected, so it needs no
    control flow.
    """
    multiplier = xp.float32(multiplier)
    min_loss_scale = xp.float32(min_loss_scale)
    counted = good_steps + 1
    period_reached = counted >= increment_period
    grown = scale * multiplier
    grow = xp.logical_and(period_reached, xp.isfinite(grown))
    scale_if_finite = xp.where(grow, grown, scale)
    scale_if_not_finite = xp.maximum(scale / multiplier, min_loss_scale)
    new_scale = xp.where(all_finite, scale_if_finite, scale_if_not_finite)
    keep_counting = xp.logical_and(all_finite, xp.logical_not(period_reached))
    new_good_steps = xp.where(keep_counting, counted, xp.zeros_like(counted))
    return new_scale, new_good_steps


class LossScale:
    """A loss scale: ``self()`` is its current value, ``update(all_finite)`` advances it.

    Subclasses implement ``__call__`` (a float32 scalar tensor in the default graph),
    ``update(all_finite) -> (update_op, should_apply)`` where ``should_apply`` is a bool
    tensor or a Python bool, and ``variables()`` (the state in the default graph).
    """

    def __call__(self):
        raise NotImplementedError

    def update(self, all_finite):
        raise NotImplementedError

    def variables(self):
        return []


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_whole_number(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _require_number(name, value, condition, allowed):
    if not (_is_number(value) and math.isfinite(value) and condition(value)):
        raise ValueError(f"{name} must be {allowed}; got {value!r}.")


class FixedLossScale(LossScale):
    """A loss scale that is always ``value`` (a finite number >= 1); no step is skipped."""

    def __init__(self, value):
        _require_number("FixedLossScale value", value, lambda v: v >= 1, "a finite number >= 1")
        self._value = float(value)

    @property
    def value(self):
        return self._value

    def __call__(self):
        return _tf.constant(self._value, _tf.float32)

    def update(self, all_finite):
        del all_finite  # TensorFlow's FixedLossScale applies every step.
        return _tf.no_op(), True

    def __repr__(self):
        return f"FixedLossScale({self._value})"


_DynamicState = collections.namedtuple("_DynamicState", ["scale", "good_steps"])


def _graph_for_state():
    """The default graph, which holds the state; callers are under ``init_scope``."""
    if _tf.executing_eagerly():
        raise RuntimeError(
            "tfamp_rewrite loss scaling builds TF1 graphs but eager execution is active; "
            "build the model inside `with tf.Graph().as_default():` or call "
            "tf.compat.v1.disable_eager_execution() first."
        )
    return _tf.get_default_graph()


class DynamicLossScale(LossScale):
    """A loss scale that halves on a non-finite step and doubles after a run of good ones.

    Args:
      initial_loss_scale: the scale of the first step (default 2**15, about half the
        largest float16); a high start is lowered in a few skipped steps.
      increment_period: consecutive finite steps after which the scale grows.
      multiplier: the factor the scale grows and shrinks by (> 1).
      min_loss_scale: the floor a run of non-finite steps cannot push the scale below.

    State, per graph: ``loss_scale/current_loss_scale`` (float32) and
    ``loss_scale/good_steps`` (int64), non-trainable resource variables in
    GLOBAL_VARIABLES (so Saver, ``global_variables_initializer`` and Horovod's broadcast of
    global variables cover them), plus a ``current_loss_scale`` scalar summary.
    They are created on first use in the graph being built, outside any control flow.
    """

    def __init__(
        self, initial_loss_scale=2**15, increment_period=2000, multiplier=2.0, min_loss_scale=1.0
    ):
        _require_number("min_loss_scale", min_loss_scale, lambda v: v > 0, "a finite number > 0")
        _require_number(
            "initial_loss_scale",
            initial_loss_scale,
            lambda v: v >= min_loss_scale,
            f"a finite number >= min_loss_scale ({min_loss_scale!r})",
        )
        if not _is_whole_number(increment_period) or increment_period < 1:
            raise ValueError(
                f"increment_period must be a whole number of steps >= 1; got {increment_period!r}."
            )
        _require_number("multiplier", multiplier, lambda v: v > 1, "a finite number > 1")
        self._initial_loss_scale = float(initial_loss_scale)
        self._increment_period = int(increment_period)
        self._multiplier = float(multiplier)
        self._min_loss_scale = float(min_loss_scale)
        # graph -> _DynamicState of weak references: the graph's GLOBAL_VARIABLES collection
        # owns the variables, so a graph this object has seen can still be freed.
        self._states = weakref.WeakKeyDictionary()

    @property
    def initial_loss_scale(self):
        return self._initial_loss_scale

    @property
    def increment_period(self):
        return self._increment_period

    @property
    def multiplier(self):
        return self._multiplier

    @property
    def min_loss_scale(self):
        return self._min_loss_scale

    def _state(self):
        with _tf.init_scope():
            graph = _graph_for_state()
            state = self._existing_state(graph)
            if state is None:
                state = self._create_state(graph)
                self._states[graph] = _DynamicState(*(weakref.ref(v) for v in state))
        return state

    def _existing_state(self, graph):
        refs = self._states.get(graph)
        if refs is None:
            return None
        state = _DynamicState(*(ref() for ref in refs))
        return state if all(v is not None for v in state) else None

    def _create_state(self, graph):
        with graph.name_scope(None):
            with graph.name_scope("loss_scale"):
                scale = _tf.Variable(
                    self._initial_loss_scale, name="current_loss_scale", dtype=_tf.float32,
                    trainable=False, use_resource=True,
                )
                good_steps = _tf.Variable(
                    0, name="good_steps", dtype=_tf.int64, trainable=False, use_resource=True
                )
            _tf.summary.scalar("current_loss_scale", scale)
        return _DynamicState(scale, good_steps)

    def __call__(self):
        return _tf.convert_to_tensor(self._state().scale)

    def update(self, all_finite):
        """Returns ``(update_op, all_finite)``: the op assigns the next scale and count."""
        state = self._state()
        new_scale, new_good_steps = next_dynamic_loss_scale(
            state.scale.read_value(),
            state.good_steps.read_value(),
            all_finite,
            increment_period=self._increment_period,
            multiplier=self._multiplier,
            min_loss_scale=self._min_loss_scale,
            xp=_GRAPH_OPS,
        )
        update_op = _tf.group(
            state.scale.assign(new_scale, read_value=False),
            state.good_steps.assign(new_good_steps, read_value=False),
            name="update_loss_scale",
        )
        return update_op, all_finite

    def variables(self):
        """The state variables in the default graph (empty before first use there)."""
        with _tf.init_scope():
            state = self._existing_state(_tf.get_default_graph())
        return list(state) if state is not None else []

    def __repr__(self):
        return (
            f"DynamicLossScale(initial_loss_scale={self._initial_loss_scale}, "
            f"increment_period={self._increment_period}, multiplier={self._multiplier}, "
            f"min_loss_scale={self._min_loss_scale})"
        )


_ALLOWED = (
    "'dynamic', a number >= 1 (a fixed scale), a tfamp_rewrite DynamicLossScale or "
    "FixedLossScale, or None (no loss scaling)"
)


class ImportedDynamicLossScale(DynamicLossScale):
    """The dynamic loss scale of a graph imported with its MetaGraph (``import_meta_graph``: a
    resumed training run): the parameters it was built with, over its imported variables
    ``[current_loss_scale, good_steps]``, found by name."""

    def __init__(self, variables, initial_loss_scale, increment_period, multiplier, min_loss_scale):
        super().__init__(initial_loss_scale, increment_period, multiplier, min_loss_scale)
        self._imported = _DynamicState(*variables)

    def _state(self):
        return self._imported

    def variables(self):
        return list(self._imported)


INITIAL_LOSS_SCALE_ENV = "TFAMP_REWRITE_INITIAL_LOSS_SCALE"


def automatic_initial_loss_scale(environ=None) -> float:
    """The first scale of the dynamic loss scale automatic loss scaling gives an optimizer:
    ``$TFAMP_REWRITE_INITIAL_LOSS_SCALE`` (where a settled run said to start), else 2**15.

    Raises ValueError, in one line naming the fix, for a value that is not a number >= 1."""
    environ = os.environ if environ is None else environ
    text = environ.get(INITIAL_LOSS_SCALE_ENV, "").strip()
    if not text:
        return float(2 ** 15)
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= 1):
        raise ValueError("%s=%r is not a number >= 1; set it to the scale a run settled at "
                         "(a power of two, e.g. 1024), or unset it for 32768"
                         % (INITIAL_LOSS_SCALE_ENV, text))
    return value


def get(identifier):
    """Returns the loss scale ``identifier`` names, with TensorFlow's rules.

    ``'dynamic'`` gives ``DynamicLossScale()``, a number gives ``FixedLossScale(number)``,
    a ``LossScale`` is returned as is, and None stays None (no loss scaling).

    Raises:
      ValueError: for anything else, saying what is allowed.
    """
    if identifier is None or isinstance(identifier, LossScale):
        return identifier
    if isinstance(identifier, str):
        if identifier == "dynamic":
            return DynamicLossScale()
        raise ValueError(f"loss_scale must be {_ALLOWED}; got the string {identifier!r}.")
    if _is_number(identifier):
        return FixedLossScale(identifier)
    kind = type(identifier).__name__
    if kind in ("DynamicLossScale", "FixedLossScale"):
        raise ValueError(
            f"loss_scale is TensorFlow's own {kind}; pass tfamp_rewrite.{kind} with the same "
            "arguments instead."
        )
    raise ValueError(f"loss_scale must be {_ALLOWED}; got {identifier!r}.")

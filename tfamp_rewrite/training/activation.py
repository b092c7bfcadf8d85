"""The process-wide switches: sessions that rewrite, optimizers that scale their loss.

* Graph rewrite: while on, constructing TensorFlow's ``Session`` or ``InteractiveSession``
  -- directly, or through ``MonitoredTrainingSession``, ``Estimator`` or Keras' backend --
  yields ``tfamp_rewrite``'s subclass.  The classes' ``__new__`` does it, so no name in
  TensorFlow changes (TensorFlow's own ``super(Session, self)`` calls keep working) and
  ``isinstance(sess, tf.compat.v1.Session)`` still holds.  Only sessions created while it
  is on rewrite (as TensorFlow's ``BaseSession`` reads its flag at construction).
* Automatic loss scaling: while on, every ``tf.compat.v1.train.Optimizer`` scales its loss
  and skips non-finite steps by itself, through a ``LossScaleOptimizer`` it creates around
  itself on first use -- NVIDIA's TF 1.15 behaviour under
  ``TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING``.  An optimizer the user wrapped
  explicitly is scaled once, by that wrapper; an optimizer that already scales its loss
  natively (NVIDIA's builds) is left to do so.

``activate_from_environment()`` reads NVIDIA's variables (``TF_ENABLE_AUTO_MIXED_PRECISION``
and its ``_GRAPH_REWRITE`` / ``_LOSS_SCALING`` refinements); ``deactivate()`` turns both
off (the optimizer methods are TensorFlow's own again; the session classes keep an inert
``__new__``).  This module is the only one that patches TensorFlow.
"""
from __future__ import annotations

import functools
import os
from typing import Mapping, Optional

from tensorflow.python.training import optimizer as optimizer_module

from . import loss_scale_optimizer
from .session import TF_SESSION_CLASSES, InteractiveSession, Session

ENABLE_ENV = "TF_ENABLE_AUTO_MIXED_PRECISION"
GRAPH_REWRITE_ENV = "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE"
LOSS_SCALING_ENV = "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING"

_REWRITING_SESSIONS = {"Session": Session, "InteractiveSession": InteractiveSession}
_Optimizer = optimizer_module.Optimizer
_ORIGINAL_METHODS = {name: _Optimizer.__dict__[name] for name in ("compute_gradients", "apply_gradients")}
_AUTO_SCALER = "_tfamp_auto_loss_scaler"

_graph_rewrite = False
_loss_scaling = False


# -- graph rewrite ------------------------------------------------------------------------
def graph_rewrite_enabled() -> bool:
    """True while sessions created from now on run the mixed-precision rewrite."""
    return _graph_rewrite


def enable_graph_rewrite() -> None:
    """New TensorFlow sessions are ``tfamp_rewrite``'s (idempotent)."""
    global _graph_rewrite
    for name, original in TF_SESSION_CLASSES.items():
        if "__new__" not in original.__dict__:
            original.__new__ = _constructing(original, _REWRITING_SESSIONS[name])
    _graph_rewrite = True


def disable_graph_rewrite() -> None:
    """New sessions are TensorFlow's again; sessions already created are unaffected."""
    global _graph_rewrite
    _graph_rewrite = False


def _constructing(original, replacement):
    """A ``__new__`` for ``original`` that builds ``replacement`` (its subclass) while on.

    Once installed it stays (switched by the flag): CPython cannot take an assigned
    ``__new__`` back, the slot left behind rejects constructor arguments.
    """
    def __new__(cls, *args, **kwargs):
        return object.__new__(replacement if cls is original and _graph_rewrite else cls)

    return staticmethod(__new__)


# -- automatic loss scaling ---------------------------------------------------------------
def loss_scaling_enabled() -> bool:
    """True while every tf.compat.v1.train.Optimizer applies dynamic loss scaling itself."""
    return _loss_scaling


def enable_loss_scaling() -> None:
    """Every ``tf.compat.v1.train.Optimizer`` scales its loss from now on (idempotent)."""
    global _loss_scaling
    for name, method in _ORIGINAL_METHODS.items():
        setattr(_Optimizer, name, _with_auto_loss_scaling(name, method))
    _loss_scaling = True


def disable_loss_scaling() -> None:
    """Optimizers stop scaling their loss in graphs built from now on."""
    global _loss_scaling
    for name, method in _ORIGINAL_METHODS.items():
        setattr(_Optimizer, name, method)
    _loss_scaling = False


def _with_auto_loss_scaling(name, method):
    @functools.wraps(method)
    def scaled(self, *args, **kwargs):
        scaler = _auto_scaler(self)
        if scaler is None:
            return method(self, *args, **kwargs)
        return getattr(scaler, name)(*args, **kwargs)

    return scaled


def _auto_scaler(opt) -> Optional[loss_scale_optimizer.LossScaleOptimizer]:
    """The LossScaleOptimizer ``opt`` delegates to, or None if ``opt`` must act itself."""
    if loss_scale_optimizer.delegating():  # a wrapper is calling the optimizer it wraps
        return None
    state = opt.__dict__
    if state.get("_loss_scale") is not None:  # NVIDIA's builds: scales natively
        return None
    scaler = state.get(_AUTO_SCALER)
    if scaler is None:
        scaler = state[_AUTO_SCALER] = loss_scale_optimizer.LossScaleOptimizer(opt, "dynamic")
    return scaler


# -- environment --------------------------------------------------------------------------
def _env_bool(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip().lower()
    if value in ("1", "true"):
        return True
    if value in ("", "0", "false"):
        return False
    raise ValueError("%s=%r is not a boolean; use 1/true or 0/false" % (name, environ[name]))


def graph_rewrite_requested(environ: Mapping[str, str] = None) -> bool:
    """NVIDIA's rule: a non-empty ``..._GRAPH_REWRITE`` decides, else ``TF_ENABLE_AUTO_MIXED_PRECISION``."""
    environ = os.environ if environ is None else environ
    if environ.get(GRAPH_REWRITE_ENV, "").strip():
        return _env_bool(environ, GRAPH_REWRITE_ENV)
    return _env_bool(environ, ENABLE_ENV)


def loss_scaling_requested(environ: Mapping[str, str] = None) -> bool:
    """NVIDIA's rule: if ``..._LOSS_SCALING`` is set, it is on iff it is ``"1"``; else the main switch."""
    environ = os.environ if environ is None else environ
    if LOSS_SCALING_ENV in environ:
        return environ[LOSS_SCALING_ENV].strip() == "1"
    return environ.get(ENABLE_ENV, "").strip() == "1"


def activate_from_environment(environ: Mapping[str, str] = None) -> None:
    """Turns each switch on that NVIDIA's environment variables ask for."""
    if graph_rewrite_requested(environ):
        enable_graph_rewrite()
    if loss_scaling_requested(environ):
        enable_loss_scaling()


def deactivate() -> None:
    """Turns both switches off, restoring TensorFlow exactly."""
    disable_graph_rewrite()
    disable_loss_scaling()


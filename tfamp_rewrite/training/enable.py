"""``enable_mixed_precision_graph_rewrite`` / ``disable_mixed_precision_graph_rewrite``.

The one-line switch of TensorFlow's ``tf.compat.v1.mixed_precision`` API: wrap the
optimizer with loss scaling and turn the graph rewrite on for Sessions created from now
on.  This module wraps the optimizer; ``activation`` owns the switch that makes new
Sessions rewrite.

Differences from TensorFlow, on purpose:

* A Keras optimizer is rejected with a ``ValueError`` instead of being wrapped in Keras'
  ``LossScaleOptimizer``: Keras has its own loss scaling (whose API differs between
  TF 1.15 and 2.x) and this package serves ``tf.compat.v1.train`` graph training.
* Grappler's own ``auto_mixed_precision`` option is left alone, so TensorFlow does not
  rewrite the graph a second time.
"""
from __future__ import annotations

import gc
import logging

import tensorflow as tf

from . import activation, keras_compat, step_watch
from .loss_scale_optimizer import LossScaleOptimizer

_logger = logging.getLogger(__name__)
_warned_about_existing_sessions = False


def _open_sessions():
    """Sessions that are alive and not closed (found by a scan of the garbage collector).

    TensorFlow keeps no registry of its sessions, so this looks at every object once; it
    runs only when the rewrite is enabled.
    """
    session_types = (tf.compat.v1.Session, tf.compat.v1.InteractiveSession)
    return [
        obj for obj in gc.get_objects()
        if issubclass(type(obj), session_types) and not getattr(obj, "_closed", False)
    ]


def _warn_once_if_sessions_exist():
    global _warned_about_existing_sessions
    if _warned_about_existing_sessions:
        return
    count = len(_open_sessions())
    if count:
        _warned_about_existing_sessions = True
        _logger.warning(
            "tfamp_rewrite: %d tf.compat.v1.Session(s) already exist; the mixed precision "
            "graph rewrite applies only to Sessions created after "
            "enable_mixed_precision_graph_rewrite(), so these keep running in float32.",
            count,
        )


def enable_mixed_precision_graph_rewrite(opt, loss_scale="dynamic", auto_fix=None):
    """Returns ``opt`` wrapped in a ``LossScaleOptimizer`` and enables the graph rewrite.

    Args:
      opt: a ``tf.compat.v1.train.Optimizer`` not yet wrapped with loss scaling.
      loss_scale: ``'dynamic'`` (default), a number >= 1 for a fixed scale, or a
        ``DynamicLossScale`` / ``FixedLossScale``.
      auto_fix: whether sessions heal a run of skipped steps by keeping the half node
        behind it float32 (step_watch.py); None (default): ``TFAMP_REWRITE_AUTO_FIX``, on
        unless it is 0.

    Raises:
      ValueError: the Keras global dtype policy is already a mixed one, ``opt`` is not a
        ``tf.compat.v1.train.Optimizer`` (Keras optimizers included), it already does loss
        scaling, or ``loss_scale`` is not valid.  Nothing is enabled then.

    Sessions that already exist are not affected (one warning says so); the flag is
    process-wide until ``disable_mixed_precision_graph_rewrite()``.
    """
    if keras_compat.global_policy_is_mixed():
        raise ValueError(
            "The Keras global dtype policy is already a mixed precision one, so mixed "
            "precision is on twice; use either Keras' policy or "
            "enable_mixed_precision_graph_rewrite, and set the policy back to 'float32' for "
            "the rewrite."
        )
    wrapped = LossScaleOptimizer(opt, loss_scale)
    _warn_once_if_sessions_exist()
    step_watch.set_auto_fix_default(auto_fix)
    activation.enable_graph_rewrite()
    return wrapped


def disable_mixed_precision_graph_rewrite():
    """Turns the graph rewrite off for Sessions created from now on.

    Optimizers already wrapped keep their loss scaling; existing Sessions keep what they
    had when they were created.
    """
    if not activation.graph_rewrite_enabled():
        _logger.warning(
            "tfamp_rewrite: disable_mixed_precision_graph_rewrite() called while the graph "
            "rewrite is already disabled; nothing changes."
        )
    activation.disable_graph_rewrite()

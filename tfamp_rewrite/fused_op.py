"""Unscale gradients and check them for inf/nan in one step.

``unscale_and_check_finite(grads, inv_scale)`` is the contract shared by the loss-scale
optimizer and the fused ``UnscaleAndCheckFinite`` custom op: every gradient comes back
as ``g * inv_scale`` (computed in float32, rounded to the gradient's dtype; inf and nan
propagate), and ``all_finite`` is a scalar bool that is True iff every element of every
*input* gradient is finite.  ``None`` entries pass through as ``None``;
``IndexedSlices`` keep their indices and only their values are unscaled and checked.

This module holds the composite implementation made of stock TensorFlow ops.
"""
from __future__ import annotations

import tensorflow as tf

_tf = tf.compat.v1


def _dense_values(grad):
    """The tensor whose elements are unscaled and checked for ``grad``."""
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _with_values(grad, values):
    """``grad`` with its dense values replaced by ``values``."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values


def _unscale(values, inv_scale):
    if values.dtype == tf.float32:
        return values * inv_scale
    return tf.cast(tf.cast(values, tf.float32) * inv_scale, values.dtype)


def unscale_and_check_finite(grads, inv_scale):
    """Returns ``(unscaled_grads, all_finite)`` for a list of gradients.

    Args:
      grads: list of ``Tensor`` / ``IndexedSlices`` / ``None`` (half, float or bfloat16).
      inv_scale: scalar float32 tensor or number, the reciprocal of the loss scale.

    Raises:
      ValueError: if ``grads`` holds no gradient at all, or a gradient is not floating point.
    """
    grads = list(grads)
    present = [g for g in grads if g is not None]
    if not present:
        raise ValueError(
            "unscale_and_check_finite needs at least one gradient; got only None entries "
            "(check that the loss depends on the trainable variables)."
        )
    for g in present:
        dtype = _dense_values(g).dtype
        if dtype not in (tf.float16, tf.float32, tf.bfloat16):
            raise ValueError(
                "unscale_and_check_finite takes float16, float32 or bfloat16 gradients; "
                "got %s for %s." % (dtype.name, getattr(g, "name", g))
            )
    with _tf.name_scope("unscale_and_check_finite"):
        inv_scale = tf.convert_to_tensor(inv_scale, dtype=tf.float32)
        finite_flags = [
            tf.reduce_all(tf.math.is_finite(_dense_values(g))) for g in present
        ]
        all_finite = tf.reduce_all(tf.stack(finite_flags))
        unscaled = [
            None if g is None else _with_values(g, _unscale(_dense_values(g), inv_scale))
            for g in grads
        ]
    return unscaled, all_finite

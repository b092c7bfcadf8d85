"""Round float32 values to half in one pass: the compiled ``RoundToHalf`` op.

``round_to_half(x, dtype)`` returns ``x`` rounded to the nearest float16 (or bfloat16)
value, as float32: bit for bit TensorFlow's CPU ``Cast(Cast(x, dtype), float32)`` (round to
nearest even, overflow to inf, half subnormals kept; nan becomes the canonical quiet nan,
see ``custom_ops/round_to_half/round_element.h``), in one pass over memory instead of two
TensorFlow Cast kernels.  Emulated Tensor Core numerics (graph_rewrite/emulation.py)
round every half tensor this way.

The op lives in the library ``op.py`` loads (``TFAMP_DISABLE_FUSED_OP=1`` disables it too;
``TFAMP_DISABLE_ROUNDING_OP=1`` disables it alone) and has a CPU kernel only, so
``round_to_half_available()`` is False where a GPU is visible: a rounding placed on the
host would copy each tensor off the GPU and back.  Where it is False, ``round_to_half`` is
the Cast pair.  Which one runs is logged once.
"""
from __future__ import annotations

import os

import tensorflow as tf

from . import op

ROUND_OP_TYPE = "RoundToHalf"
DISABLE_ENV = "TFAMP_DISABLE_ROUNDING_OP"
_USER = "emulated rounding to half"
_FALLBACK = "Cast pairs"


class _RoundingChoice:
    """Whether this process rounds with the op: decided once, logged once."""

    def __init__(self):
        self._module = None
        self._decided = False

    def module(self):
        """The op library's module when RoundToHalf may be used here, else None."""
        if not self._decided:
            self._decided = True
            reason = _not_here()
            if reason is not None:
                op.loader().tell_once(_USER, ROUND_OP_TYPE, _FALLBACK, reason)
            else:
                self._module = op.loader().module(_USER, ROUND_OP_TYPE, _FALLBACK)
                if self._module is not None:
                    _register_gradient()
        return self._module


def _not_here():
    """Why RoundToHalf must not run in this process whether or not the library loads; None if it may."""
    if op.env_flag(DISABLE_ENV):
        return "disabled by %s=%s" % (DISABLE_ENV, os.environ[DISABLE_ENV])
    gpus = tf.config.experimental.list_physical_devices("GPU")
    if gpus:
        return "a GPU is visible (%s) and it has a CPU kernel only" % gpus[0].name
    return None


_CHOICE = _RoundingChoice()


def round_to_half_available() -> bool:
    """True iff ``RoundToHalf`` nodes run here: the library loads and no GPU is visible."""
    return _CHOICE.module() is not None


def round_to_half(x, dtype="float16", name=None):
    """``x`` (float32) rounded to ``dtype``'s nearest value, as float32 (module docstring)."""
    half = tf.as_dtype(dtype)
    if half not in (tf.float16, tf.bfloat16):
        raise ValueError("round_to_half rounds to float16 or bfloat16; got %s" % half.name)
    x = tf.convert_to_tensor(x, tf.float32)
    module = _CHOICE.module()
    if module is None:
        with tf.compat.v1.name_scope(name, "RoundToHalf", [x]):
            return tf.cast(tf.cast(x, half), tf.float32)
    return module.round_to_half(x, half_type=half, name=name)


def _register_gradient() -> None:
    """The Cast pair's gradient: the incoming gradient rounded the same way."""
    try:
        @tf.RegisterGradient(ROUND_OP_TYPE)
        def _round_to_half_grad(node, grad):
            return round_to_half(grad, node.get_attr("half_type"))
    except KeyError:
        pass  # registered by an earlier choice in this process

"""What tfamp_rewrite needs to know about Keras, in TF 1.15 and in TF 2.x.

Keras is never imported here: in TF 1.15 it ships inside TensorFlow (``tf.keras``), in
TF 2.x it is its own package (``keras`` or ``tf_keras``) that TensorFlow loads lazily, and
only a Keras that is already loaded can hold a user's global dtype policy.
"""
from __future__ import annotations

import sys

import tensorflow as tf

_KERAS_MODULE_PREFIXES = ("keras.", "tf_keras.", "tensorflow.python.keras.", "tensorflow.keras.")


def is_keras_object(obj):
    """True if ``obj``'s class, or a base class, is defined by Keras."""
    return any(
        cls.__module__.startswith(_KERAS_MODULE_PREFIXES) for cls in type(obj).__mro__
    )


def _global_policy_getter():
    """Keras' ``global_policy`` function, or None when no Keras with policies is loaded."""
    for module_name in ("keras", "tf_keras"):  # TF 2.x
        mixed_precision = getattr(sys.modules.get(module_name), "mixed_precision", None)
        getter = getattr(mixed_precision, "global_policy", None)
        if getter is not None:
            return getter
    if tf.__version__.startswith("1."):  # TF 1.15: Keras inside TensorFlow, policy API experimental
        keras_mixed_precision = getattr(tf.compat.v1.keras, "mixed_precision", None)
        return getattr(getattr(keras_mixed_precision, "experimental", None), "global_policy", None)
    return None


def loss_scale_optimizer_name(version: str = None) -> str:
    """Where the running TensorFlow's Keras keeps its LossScaleOptimizer (for messages).

    TensorFlow 1.15 (and 2.0-2.3) has it under ``mixed_precision.experimental``; 2.4 moved it.
    """
    version = tf.__version__ if version is None else version
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < (2, 4):
        return "tf.keras.mixed_precision.experimental.LossScaleOptimizer"
    return "tf.keras.mixed_precision.LossScaleOptimizer"


def global_policy_is_mixed():
    """True if the Keras global dtype policy is a mixed-precision one (``mixed_float16`` ...)."""
    getter = _global_policy_getter()
    return getter is not None and getter().name.startswith("mixed")

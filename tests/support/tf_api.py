"""TensorFlow APIs the tests need whose names moved between 1.15 and 2.x, found by version.

Tests use only names TensorFlow 1.15 has (tests/tf115/test_api_surface.py checks it); where
1.15 and 2.x keep the same thing under different names, it is looked up here by string with
a default, as the package's own tf_compat does.
"""
from __future__ import annotations

import tensorflow as tf

tf1 = tf.compat.v1


def tf_loss_scaling():
    """TensorFlow's own graph-mode loss scaling: ``DynamicLossScale``,
    ``MixedPrecisionLossScaleOptimizer`` (``tf.compat.v1.mixed_precision`` from 2.4 on,
    ``tf.compat.v1.train.experimental`` in 1.15)."""
    return getattr(tf1, "mixed_precision", None) or getattr(tf1.train, "experimental", None)


def keras_sgd(learning_rate: float = 0.1):
    """A Keras SGD optimizer usable in graph mode (``optimizers.legacy`` from 2.11 on)."""
    optimizers = tf.keras.optimizers
    return getattr(optimizers, "legacy", optimizers).SGD(learning_rate)


def keras_loss_scale_optimizer(optimizer):
    """Keras' own LossScaleOptimizer around ``optimizer``, with dynamic loss scaling."""
    mixed_precision = tf.keras.mixed_precision
    if hasattr(mixed_precision, "set_global_policy"):  # TF >= 2.4: dynamic by default
        return getattr(mixed_precision, "LossScaleOptimizer", None)(optimizer)
    experimental = getattr(mixed_precision, "experimental", None)  # TF 1.15 - 2.3
    return experimental.LossScaleOptimizer(optimizer, "dynamic")


def set_keras_global_policy(name: str) -> None:
    """Keras' global dtype policy (``set_global_policy``; ``experimental.set_policy`` before 2.4)."""
    mixed_precision = tf.keras.mixed_precision
    setter = getattr(mixed_precision, "set_global_policy", None)
    if setter is None:
        setter = getattr(getattr(mixed_precision, "experimental", None), "set_policy", None)
    setter(name)

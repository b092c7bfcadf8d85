"""tfamp_rewrite: automatic mixed precision for TensorFlow 1.x graphs.

The public API is what ``__all__`` lists; everything else is implementation.
"""
from __future__ import annotations

from tfamp_rewrite.enable import (
    disable_mixed_precision_graph_rewrite,
    enable_mixed_precision_graph_rewrite,
)
from tfamp_rewrite.loss_scale import DynamicLossScale, FixedLossScale
from tfamp_rewrite.loss_scale_optimizer import LossScaleOptimizer

__all__ = [
    "DynamicLossScale",
    "FixedLossScale",
    "LossScaleOptimizer",
    "disable_mixed_precision_graph_rewrite",
    "enable_mixed_precision_graph_rewrite",
]
__version__ = "0.1.0"

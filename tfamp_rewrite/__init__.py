"""tfamp_rewrite: automatic mixed precision for TensorFlow 1.x graphs.

The public API is what ``__all__`` lists; everything else is implementation.
"""
from __future__ import annotations

from tfamp_rewrite.fused_op import fused_op_available, unscale_and_check_finite

__all__ = ["fused_op_available", "unscale_and_check_finite"]
__version__ = "0.1.0"

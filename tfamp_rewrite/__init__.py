"""tfamp_rewrite: automatic mixed precision for TensorFlow 1.x graphs.

The public API is what ``__all__`` lists; everything else is implementation.
"""
from __future__ import annotations

__all__ = []
__version__ = "0.1.0"

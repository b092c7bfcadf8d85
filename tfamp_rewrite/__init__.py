"""tfamp_rewrite: automatic mixed precision for TensorFlow 1.x graphs.

The public API is what ``__all__`` lists; everything else is implementation.
"""
from __future__ import annotations

from .devices import set_rewrite_target
from .enable import disable_mixed_precision_graph_rewrite, enable_mixed_precision_graph_rewrite
from .errors import GraphRewriteError
from .fused_op import fused_op_available, unscale_and_check_finite
from .loss_scale import DynamicLossScale, FixedLossScale
from .loss_scale_optimizer import LossScaleOptimizer
from .op_lists import OpLists, builtin_lists
from .report import NodeDecision, RewriteReport
from .rewrite import RewriteResult, rewrite_graph_def
from .session import InteractiveSession, Session

__all__ = [
    "DynamicLossScale",
    "FixedLossScale",
    "GraphRewriteError",
    "InteractiveSession",
    "LossScaleOptimizer",
    "NodeDecision",
    "OpLists",
    "RewriteReport",
    "RewriteResult",
    "Session",
    "builtin_lists",
    "disable_mixed_precision_graph_rewrite",
    "enable_mixed_precision_graph_rewrite",
    "fused_op_available",
    "rewrite_graph_def",
    "set_rewrite_target",
    "unscale_and_check_finite",
]
__version__ = "0.1.0"

"""tfamp_rewrite: automatic mixed precision for TensorFlow 1.x graphs.

The public API is what ``__all__`` lists; everything else is implementation.
"""
from __future__ import annotations

from .errors import GraphRewriteError
from .op_lists import OpLists, builtin_lists
from .report import NodeDecision, RewriteReport
from .rewrite import RewriteResult, rewrite_graph_def

__all__ = [
    "GraphRewriteError",
    "NodeDecision",
    "OpLists",
    "RewriteReport",
    "RewriteResult",
    "builtin_lists",
    "rewrite_graph_def",
]
__version__ = "0.1.0"

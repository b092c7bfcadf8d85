"""tfamp_rewrite: automatic mixed precision for TensorFlow 1.x graphs.

The public API is what ``__all__`` lists; everything else is implementation.  Names are
imported on first use (PEP 562), so ``import tfamp_rewrite`` -- and the command line's
argument checks -- do not pay for importing TensorFlow.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "DoctorReport": "doctor.report",
    "DynamicLossScale": "training.loss_scale",
    "FixedLossScale": "training.loss_scale",
    "GraphRewriteError": "errors",
    "InteractiveSession": "training.session",
    "LossScaleOptimizer": "training.loss_scale_optimizer",
    "NodeDecision": "graph_rewrite.report",
    "OpLists": "graph_rewrite.op_lists",
    "RewriteReport": "graph_rewrite.report",
    "RewriteResult": "graph_rewrite.rewrite",
    "Session": "training.session",
    "builtin_lists": "graph_rewrite.op_lists",
    "diagnose": "training.diagnose",
    "disable_mixed_precision_graph_rewrite": "training.enable",
    "enable_mixed_precision_graph_rewrite": "training.enable",
    "fused_op_available": "fused_op.op",
    "rewrite_graph_def": "graph_rewrite.rewrite",
    "set_rewrite_target": "training.devices",
    "unscale_and_check_finite": "fused_op.op",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError("module 'tfamp_rewrite' has no attribute %r" % name)
    value = getattr(importlib.import_module("." + module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

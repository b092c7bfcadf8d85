"""Saying so when a graph that runs in float16 trains without loss scaling.

Automatic loss scaling (``TF_ENABLE_AUTO_MIXED_PRECISION=1``, ``tfamp-run``) wraps
``tf.compat.v1.train`` optimizers.  A graph updated by anything else -- a Keras optimizer
(``model.compile("adam")``), an optimizer built before loss scaling was switched on or with
it switched off -- computes its float16 gradients from an unscaled loss, where values below
float16's smallest subnormal (6e-8) flush to zero.  It still trains, so nothing fails; the
session says it once.
"""
from __future__ import annotations

import re
from typing import Optional

from .keras_compat import loss_scale_optimizer_name
from .step_signals import step_signals

_UPDATE_OP = re.compile(r"^(Resource)?(Sparse)?Apply[A-Z]")
_VARIABLE_OPS = ("VariableV2", "VarHandleOp")


def unscaled_training_warning(graph, dtype: str) -> Optional[str]:
    """The warning for ``graph`` if it trains in float16 with none of its updates loss-scaled
    (and no Keras loss scale of its own), else None."""
    if dtype != "float16" or step_signals(graph):
        return None
    updates, scaled_elsewhere = [], False
    for op in graph.get_operations():
        if _UPDATE_OP.match(op.type):
            updates.append(op)
        elif op.type in _VARIABLE_OPS and "loss_scale" in op.name:  # Keras' LossScaleOptimizer
            scaled_elsewhere = True
    if not updates or scaled_elsewhere:
        return None
    return (
        "tfamp_rewrite: this graph trains in float16 without loss scaling: none of its %d update "
        "op(s) (e.g. '%s', %s) comes from a loss-scaled optimizer, so float16 gradients below "
        "6e-8 flush to zero. Automatic loss scaling (TF_ENABLE_AUTO_MIXED_PRECISION=1) covers the "
        "tf.compat.v1.train optimizers built while it is on; wrap a Keras optimizer in %s, "
        "another in tfamp_rewrite.LossScaleOptimizer."
        % (len(updates), updates[0].name, updates[0].type, loss_scale_optimizer_name()))

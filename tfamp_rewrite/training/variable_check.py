"""Do the model's own weights hold inf/nan?  Asked when loss-scaled steps keep being skipped.

A weight that is already inf or nan -- restored from a checkpoint of a run that diverged,
assigned by the program, or left by a float32 update that overflowed -- makes every
forward pass non-finite, in float32 as in half.  Then no loss scale, and no node kept
float32, can help, and a diagnosis that blamed a half tensor would be wrong.

The same holds for non-trainable state the step reads -- a memory bank, a queue of keys --
that a write the session could not guard (state_guard.py) left inf/nan.

``VariableCheck(user_graph, private_graph, private_fetch, read)`` adds, in the session's
private graph, one ``reduce_all(is_finite(value))`` per floating trainable variable of the
user's graph, then per one of its ``state_variables`` named in ``read`` (what the steps read);
``nonfinite(run_private)`` runs them and returns the names of the variables that are not
finite, in that order; ``state`` names the non-trainable ones.  Nothing is added to the
user's graph.
"""
from __future__ import annotations

from typing import Callable, List

import tensorflow as tf

from .step_signals import loss_scale_variables, step_signals

# A variable's own node, in ref (TF1) and resource form.
VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp"})

SCOPE = "tfamp_variable_check"


def state_variables(graph) -> list:
    """``graph``'s non-trainable floating global variables, the loss scales' aside: the
    state a training run writes besides the optimizer's update (a batch norm's averages,
    a queue of keys, an optimizer's slots)."""
    keys = tf.compat.v1.GraphKeys
    trainable = {v.op.name for v in graph.get_collection(keys.TRAINABLE_VARIABLES)}
    scales = {v.op.name for v in loss_scale_variables(step_signals(graph))}
    return [v for v in graph.get_collection(keys.GLOBAL_VARIABLES)
            if v.dtype.base_dtype.is_floating and v.op.name not in trainable | scales]


class VariableCheck:
    """Finite checks of one private graph's copy of the trainable variables (module docstring)."""

    def __init__(self, user_graph, private_graph, private_fetch: Callable, read=frozenset()):
        trainable = [v for v in user_graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
                     if v.dtype.base_dtype.is_floating]
        state = [v for v in state_variables(user_graph) if v.op.name in read]
        variables = trainable + state
        self.names = [v.op.name for v in variables]
        self.state = {v.op.name for v in state}  # not trainable
        self._flags = []
        with private_graph.as_default(), tf.name_scope(SCOPE):
            for variable in variables:
                stored = private_fetch(user_graph.get_tensor_by_name(variable.name))
                if stored.dtype == tf.resource:  # the handle: read the value
                    stored = tf.raw_ops.ReadVariableOp(resource=stored, dtype=variable.dtype.base_dtype)
                self._flags.append(tf.reduce_all(tf.math.is_finite(stored)))

    def nonfinite(self, run_private: Callable) -> List[str]:
        """Names of the variables holding inf/nan now; ``run_private(fetches)`` runs the
        private graph's ``fetches`` and returns their values."""
        if not self._flags:
            return []
        return [name for name, finite in zip(self.names, run_private(self._flags)) if not finite]

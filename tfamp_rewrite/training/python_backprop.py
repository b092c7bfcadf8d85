"""Python code in a loss-scaled backprop sees the gradients float32 would give it.

A gradient written in numpy (``gradient_override_map`` to a function calling ``tf.py_func``,
DQN's error clipping ``np.clip(dy, -1, 1)``) is given the backprop's values, which loss
scaling multiplied by the scale: a clip or threshold in it then bites where float32's
would not, and the update, divided by the scale afterwards, shrinks by it.  TensorFlow ops
doing the same are said (``loss_scale_optimizer._warn_if_backprop_clips``); Python is
opaque, so ``unscale_around_python`` divides what such a node reads from the backprop's
seed by the scale and multiplies its results back: the Python code computes on float32's
values, and a gradient linear in them (``dy * f'(x)``) comes out as before.
"""
from __future__ import annotations

from typing import Callable, Dict

import tensorflow as tf

PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})

_tf = tf.compat.v1


def unscale_around_python(backprop_ops, scale, from_the_seed: Callable) -> Dict:
    """Rewires each Python node of ``backprop_ops`` (operations a ``compute_gradients`` just
    built) that reads values ``from_the_seed(tensor)`` carries the loss ``scale`` in: those
    inputs divided by it, its floating outputs multiplied by it for every reader.  Nodes in
    a TF1 while loop or cond are left as they are (the scale cannot be read there).
    Returns ``{output's name: its rescaled tensor}``, for gradients that are such an output."""
    rewired = {}
    for op in backprop_ops:
        if op.type not in PYTHON_OPS or op._get_control_flow_context() is not None:  # pylint: disable=protected-access
            continue
        scaled = [i for i, t in enumerate(op.inputs) if t.dtype.is_floating and from_the_seed(t)]
        if not scaled:
            continue
        for i in scaled:
            tensor = op.inputs[i]
            op._update_input(i, tensor / _tf.cast(scale, tensor.dtype))  # pylint: disable=protected-access
        for output in op.outputs:
            if output.dtype.is_floating:
                rewired[output.name] = _multiplied_for_readers(output, scale)
    return rewired


def _multiplied_for_readers(output, scale):
    readers = [(consumer, j) for consumer in output.consumers()
               for j, tensor in enumerate(consumer.inputs) if tensor is output]
    rescaled = output * _tf.cast(scale, output.dtype)
    for consumer, j in readers:
        consumer._update_input(j, rescaled)  # pylint: disable=protected-access
    return rescaled

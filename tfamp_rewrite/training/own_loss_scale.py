"""A loss the program scales itself, as TF1 code did before automatic mixed precision.

OpenSeq2Seq and NVIDIA's examples multiplied the loss by a constant (``loss * 1024.``, a
static scale) or by a non-trainable variable their own code halved and doubled (a dynamic
scale written by hand), and divided the gradients by it.  ``own_scale(loss)`` names that
factor: ``"1024"`` or ``"the variable 'loss_scale'"``, or None for a loss no such factor
multiplies.  Casts, identities and variable reads between the product and its factor are
looked through.  A loss-scale object's variable (``current_loss_scale``: this package's,
TensorFlow's and Keras' loss-scale optimizers) is no program's own.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

_LOOKED_THROUGH = ("Cast", "Identity", "ReadVariableOp", "Snapshot")
_VARIABLES = ("VariableV2", "Variable", "VarHandleOp")
_LOSS_SCALE_OBJECTS = "current_loss_scale"  # the variable's name in every loss-scale object
_FLOATING = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def own_scale(loss) -> Optional[str]:
    """The factor of ``loss`` (a tensor or its op) that is the program's own loss scale: a
    constant of 2 or more, or a non-trainable floating variable; None if it has none."""
    op = getattr(loss, "op", loss)
    if op.type != "Mul":
        return None
    for operand in op.inputs:
        source = operand.op
        while source.type in _LOOKED_THROUGH and source.inputs:
            source = source.inputs[0].op
        if source.type == "Const":
            value = tf.compat.v1.make_ndarray(source.get_attr("value"))
            if value.size == 1 and abs(float(value.reshape(()))) >= 2:
                return "%g" % float(value.reshape(()))
        elif source.type in _VARIABLES and _non_trainable_float(source) and \
                not source.name.endswith(_LOSS_SCALE_OBJECTS):
            return "the variable %r" % source.name
    return None


def _non_trainable_float(variable_op) -> bool:
    dtype = tf.as_dtype(variable_op.get_attr("dtype")).base_dtype
    trainable = {v.op.name for v in variable_op.graph.get_collection(
        tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
    return dtype in _FLOATING and variable_op.name not in trainable

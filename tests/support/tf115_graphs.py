"""Graphs made with TensorFlow 2.x, turned into graphs as TensorFlow 1.15 writes them.

Users on TensorFlow 1.15 convert graphs their 1.15 wrote; the tests build theirs with 2.x.
What differs only because 2.x built the graph is taken out before it goes to 1.15:

* ``portable_graph(model, keep)``: 2.x's initialisers (Keras' ``glorot_uniform`` behind
  ``tf.compat.v1.layers``) use stateless random ops 1.15 lacks (``StatelessRandomUniformV2``):
  every variable is initialised from a Const instead, and the nodes nothing needs any more
  are pruned, so both TensorFlows also start from the same weights. A Const holds the
  value 2.x's initialiser gives where that is constant (zeros, ones), else a seeded
  Glorot-uniform draw (Keras' unseeded initialisers draw anew in each process).
  2.x's training-mode batch norm passes the moving statistics to FusedBatchNormV3, which
  ignores them (``exponential_avg_factor`` 1); 1.15's kernel requires them empty, as its
  layers pass them: they become an empty Const.
* ``written_by_tf115(graph_def, tf115)``: the graph without the attributes 1.15's op
  registry lacks (2.x's resource variables carry a non-default ``debug_name``), imported
  into TensorFlow 1.15 and exported from it: 1.15's own GraphDef, its producer version
  and default attributes included.
"""
from __future__ import annotations

import zlib
from typing import Dict, FrozenSet, Iterable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, op_def_pb2

tf1 = tf.compat.v1
_ASSIGN_OPS = ("AssignVariableOp", "Assign")


def op_attrs(op_list: bytes) -> Dict[str, FrozenSet[str]]:
    """``{op type: attribute names}`` of a serialized OpList."""
    ops = op_def_pb2.OpList.FromString(op_list)
    return {op.name: frozenset(attr.name for attr in op.attr) for op in ops.op}


def written_by_tf115(graph_def, tf115, known: Dict[str, FrozenSet[str]]):
    """``graph_def`` as TensorFlow 1.15 writes it (see the module docstring)."""
    trimmed = graph_pb2.GraphDef()
    trimmed.CopyFrom(graph_def)
    nodes = list(trimmed.node) + [n for f in trimmed.library.function for n in f.node_def]
    for node in nodes:
        for name in [a for a in node.attr if not a.startswith("_")]:
            if node.op in known and name not in known[node.op]:
                del node.attr[name]
    return graph_pb2.GraphDef.FromString(tf115.export_graph_def(trimmed.SerializeToString()))


def portable_graph(model, keep: Iterable[str]):
    """``model.graph_def`` as 1.15's layers build it, pruned to ``keep`` and the init op."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(model.graph_def, name="")
    init = graph.get_operation_by_name(model.init)
    assigns = [op for op in init.control_inputs if op.type in _ASSIGN_OPS]
    with tf1.Session(graph=graph) as session:
        values = session.run([op.inputs[1] for op in assigns])
    graph_def = graph.as_graph_def()
    by_name = {node.name: node for node in graph_def.node}
    for op, value in zip(assigns, values):
        value = np.asarray(value)
        if value.size and value.min() != value.max():
            value = _glorot_uniform(value.shape, value.dtype, seed=zlib.crc32(op.name.encode()))
        const = graph_def.node.add()
        const.name = op.name + "/initial_value"
        const.op = "Const"
        const.attr["dtype"].type = op.inputs[1].dtype.as_datatype_enum
        const.attr["value"].tensor.CopyFrom(tf1.make_tensor_proto(value))
        by_name[op.name].input[1] = const.name
    _empty_training_statistics(graph_def)
    return tf1.graph_util.extract_sub_graph(graph_def, list(keep) + [model.init])


def _glorot_uniform(shape, dtype, seed: int):
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    fan_in = shape[-2] * receptive if len(shape) > 1 else shape[0]
    fan_out = shape[-1] * receptive
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return np.random.default_rng(seed).uniform(-limit, limit, shape).astype(dtype)


def _empty_training_statistics(graph_def) -> None:
    empty = None
    for node in list(graph_def.node):
        if node.op != "FusedBatchNormV3" or not node.attr["is_training"].b:
            continue
        assert node.attr["exponential_avg_factor"].f == 1.0, node.name  # statistics unused
        if empty is None:
            empty = graph_def.node.add()
            empty.name = "tf115_empty_statistics"
            empty.op = "Const"
            empty.attr["dtype"].type = tf.float32.as_datatype_enum
            empty.attr["value"].tensor.CopyFrom(tf1.make_tensor_proto(np.zeros([0], np.float32)))
        node.input[3] = node.input[4] = empty.name

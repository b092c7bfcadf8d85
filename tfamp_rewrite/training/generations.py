"""A second rewrite of a graph imported beside the first, sharing the first one's state.

A session cannot swap its graph, and its state -- variables, queues, iterators, tables --
lives in resources named by the nodes that create them.  So a new rewrite of the user's
graph (after a heal keeps a node float32) is imported into the same private graph under a
name scope, with every *state source* of the rewrite mapped onto the node of the same name
already there instead of copied::

    state source = a stateful op with no inputs whose output is a resource or a reference
                   (VariableV2, VarHandleOp, FIFOQueueV2, IteratorV2, HashTableV2, ...)
    import the sources the private graph lacks, under their own names
    import everything else under "<scope>/", its inputs from sources mapped to them

The copy's reads, assigns, dequeues and saves then act on the same variables, queue
positions and iterators; nothing is re-initialised, and a checkpoint still names each
variable as the user graph does.  (Random ops are copies: their sequences restart.)
"""
from __future__ import annotations

import re
from typing import Iterable, Set

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from ..graph_rewrite.graph_view import parse_input
from ..tf_compat import lookup_op_def

GENERATION_SCOPE = "tfamp_heal_%d"  # the scope of each generation after the first
# that scope where a kernel's message names an op of it ("Infinity in Histogram for: ...")
GENERATION_SCOPE_IN_TEXT = re.compile(r"\btfamp_heal_\d+/")


def state_sources(graph_def) -> Set[str]:
    """Names of the nodes of ``graph_def`` that create state (module docstring)."""
    found = set()
    for node in graph_def.node:
        op_def = lookup_op_def(node.op)
        if op_def is None or not op_def.is_stateful or op_def.input_arg:
            continue
        if any(arg.is_ref or arg.type == types_pb2.DT_RESOURCE for arg in op_def.output_arg):
            found.add(node.name)
    return found


def import_generation(private_graph: tf.Graph, graph_def, scope: str, sources: Iterable[str]) -> None:
    """Imports ``graph_def`` into ``private_graph`` under ``scope``, sharing its state sources."""
    sources = set(sources)
    existing = {op.name for op in private_graph.get_operations()}
    missing = graph_pb2.GraphDef()
    missing.versions.CopyFrom(graph_def.versions)
    rest = graph_pb2.GraphDef()
    rest.versions.CopyFrom(graph_def.versions)
    rest.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name not in sources:
            _drop_colocation_with(rest.node.add(), node, sources)
        elif node.name not in existing:
            copy = missing.node.add()
            copy.CopyFrom(node)
            del copy.input[:]  # a source's only inputs are control dependencies
    with private_graph.as_default():
        if missing.node:
            tf.import_graph_def(missing, name="")
        tf.import_graph_def(rest, input_map=_source_map(private_graph, rest, sources), name=scope)


def _drop_colocation_with(copy, node, sources: Set[str]) -> None:
    """``copy`` = ``node`` without colocation constraints naming a source.

    The importer would rename ``loc:@w`` to the scoped copy of ``w``, which is not imported;
    TensorFlow's placer still keeps an op on a resource or reference with its variable.
    """
    copy.CopyFrom(node)
    if "_class" not in copy.attr:
        return
    kept = [c for c in copy.attr["_class"].list.s if c[len(b"loc:@"):].decode() not in sources]
    if kept:
        del copy.attr["_class"].list.s[:]
        copy.attr["_class"].list.s.extend(kept)
    else:
        del copy.attr["_class"]


def _source_map(private_graph: tf.Graph, graph_def, sources: Set[str]) -> dict:
    mapping = {}
    for node in graph_def.node:
        for text in node.input:
            name, port = parse_input(text)
            if name not in sources:
                continue
            op = private_graph.get_operation_by_name(name)
            if port < 0:
                mapping["^" + name] = op
            else:
                mapping["%s:%d" % (name, port)] = op.outputs[port]
    return mapping

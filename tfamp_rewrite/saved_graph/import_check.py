"""Does TensorFlow itself import the input?  The last word on what a valid graph is.

``op_def_check`` names the common problems clearly; TensorFlow's importer also runs every
op's shape function (a Conv2D with three dilations, a reduction over an axis the input does
not have), checks collections and the Saver of a MetaGraph, and more.  ``check_importable``
imports the input into a throw-away ``tf.Graph`` -- ``import_graph_def`` for a frozen graph,
``import_meta_graph`` for a MetaGraph or SavedModel; nothing is run -- and turns a refusal
into one ``ConversionError`` line.  For a MetaGraph it then checks what loading and serving
look up by name: the Saver's tensors, the asset tensors and every signature's tensors.

Nodes of ops this TensorFlow does not register are replaced by stubs first
(``stub_unknown_ops``): a registered op with no inputs whose outputs have the dtypes the
consumers expect, so everything around them is still checked.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from typing import Dict, Optional

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from ..dtypes import DT_FLOAT
from ..errors import ConversionError
from ..graph_rewrite.graph_view import parse_input
from ..tf_compat import lookup_op_def
from .op_def_check import node_ports, unknown_op_nodes

_STUB_OP = "Unstage"  # no inputs, outputs of any number and dtypes (attr dtypes)
_MAX_MESSAGE = 300
_OP_SIGNATURE = re.compile(r";?\s*Op<name=([^;>]+).*>")  # to its last '>': signatures hold "->"
_NODE_DUMP = re.compile(r"'\{\{node ([^}]*)\}\} = [^']*'")  # '{{node x}} = Conv2D[...](inputs)'
_NODE_REFERENCE = re.compile(r"(NodeDef: )?\{\{node ([^}]*)\}\}")


def stub_unknown_ops(graph_def) -> graph_pb2.GraphDef:
    """``graph_def`` itself if every op is known, else a copy with each unknown-op node replaced
    by a stub whose outputs have the dtypes its consumers expect (float32 where none says)."""
    unknown = set(unknown_op_nodes(graph_def))
    if not unknown:
        return graph_def
    expected = _expected_dtypes(graph_def, unknown)
    stubbed = graph_pb2.GraphDef()
    stubbed.CopyFrom(graph_def)
    for node in stubbed.node:
        if node.name not in unknown:
            continue
        dtypes = expected.get(node.name, {})
        sources = sorted({parse_input(text)[0] for text in node.input})
        node.op = _STUB_OP
        node.ClearField("attr")
        del node.input[:]
        node.input.extend("^" + source for source in sources)
        outputs = node.attr["dtypes"].list.type
        outputs.extend(dtypes.get(port, DT_FLOAT) for port in range(max(dtypes, default=0) + 1))
    return stubbed


def _expected_dtypes(graph_def, unknown) -> Dict[str, Dict[int, int]]:
    """unknown node -> {output port: the (non-reference) dtype its first known consumer expects}."""
    functions = {f.signature.name: f.signature for f in graph_def.library.function}
    expected: Dict[str, Dict[int, int]] = {}
    for node in graph_def.node:
        op_def = lookup_op_def(node.op) or functions.get(node.op)
        reads = [parse_input(text) for text in node.input if not text.startswith("^")]
        if not any(source in unknown for source, _ in reads):
            continue
        inputs = None
        if op_def is not None:
            try:
                inputs = node_ports(node, op_def)[0]
            except ValueError:
                inputs = None
        for index, (source, port) in enumerate(reads):
            if source not in unknown:
                continue
            dtype = _port_dtype(inputs, index)
            expected.setdefault(source, {}).setdefault(port, dtype if dtype is not None else DT_FLOAT)
    return expected


def _port_dtype(inputs, index: int) -> Optional[int]:
    if inputs is None or index >= inputs.count:
        return None
    dtype = inputs.dtype(index)
    return dtype - 100 if dtype is not None and dtype > 100 else dtype


def check_importable(saved) -> None:
    """Raises ConversionError if TensorFlow refuses to import ``saved`` (a formats.SavedGraph)."""
    import tensorflow as tf

    graph_def = stub_unknown_ops(saved.graph_def)
    missing = None
    try:
        with _quiet(), tf.Graph().as_default():
            if saved.meta_graph is None:  # a copy: the importer fills in default attributes
                copy = graph_pb2.GraphDef()
                copy.CopyFrom(graph_def)
                tf.compat.v1.import_graph_def(copy, name="")
            else:
                meta_graph = meta_graph_pb2.MetaGraphDef()
                meta_graph.CopyFrom(saved.meta_graph)
                if graph_def is not saved.graph_def:
                    meta_graph.graph_def.CopyFrom(graph_def)
                tf.compat.v1.train.import_meta_graph(meta_graph)
                missing = _missing_reference(tf.compat.v1.get_default_graph(), meta_graph)
    except Exception as error:  # whatever TensorFlow raises, the input is what it refuses
        raise ConversionError("%s is not a valid graph: TensorFlow %s cannot import it: %s" % (
            saved.path, tf.__version__, condense(error)),
            "Re-export the graph; a graph TensorFlow cannot import cannot be converted") from None
    if saved.meta_graph is not None and missing:
        raise ConversionError("%s is not a valid graph: %s names %r, which the graph does not have" % (
            saved.path, missing[0], missing[1]), "Re-export it; loading it would fail too")


def _missing_reference(graph, meta_graph):
    """``(what, name)`` of the first tensor or op the MetaGraph names that ``graph`` lacks, or None."""
    saver = meta_graph.saver_def
    references = [("its Saver's filename tensor", saver.filename_tensor_name),
                  ("its Saver's save tensor", saver.save_tensor_name),
                  ("its Saver's restore op", saver.restore_op_name)]
    for asset in meta_graph.asset_file_def:
        references.append(("asset %r" % asset.filename, asset.tensor_info.name))
    for key, signature in sorted(meta_graph.signature_def.items()):
        for role, infos in (("input", signature.inputs), ("output", signature.outputs)):
            for name, info in sorted(infos.items()):
                what = "signature %r %s %r" % (key, role, name)
                references += [(what, tensor) for tensor in _tensors(info)]
    for what, name in references:
        if name and not _in_graph(graph, name):
            return what, name
    return None


def _tensors(info):
    encoding = info.WhichOneof("encoding")
    if encoding == "name":
        return [info.name]
    if encoding == "coo_sparse":
        sparse = info.coo_sparse
        return [sparse.values_tensor_name, sparse.indices_tensor_name, sparse.dense_shape_tensor_name]
    return []


def _in_graph(graph, name: str) -> bool:
    try:
        graph.as_graph_element(name)
    except (KeyError, ValueError, TypeError):
        return False
    return True


def condense(error: BaseException) -> str:
    """TensorFlow's message on one line, its op signatures and NodeDef dumps cut to names."""
    text = str(error) or type(error).__name__
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    text = _OP_SIGNATURE.sub(r" (op \1)", text)
    text = _NODE_REFERENCE.sub(r"node '\2'", _NODE_DUMP.sub(r"node '\1'", text))
    text = re.sub(r"\s*;\s*", "; ", text)
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE - 3] + "..."
    return text


@contextlib.contextmanager
def _quiet():
    """Holds back what TensorFlow logs while importing (C++ to file descriptor 2, Python's
    ``tensorflow`` logger): the verdict is the one line the command line prints."""
    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    saved_stderr = os.dup(2)
    try:
        with tempfile.TemporaryFile() as chatter:
            os.dup2(chatter.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved_stderr, 2)
    finally:
        os.close(saved_stderr)
        logger.setLevel(level)

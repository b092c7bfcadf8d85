"""Saved graphs on disk: frozen GraphDefs, MetaGraphs and SavedModels, read and written.

``read_saved_graph(path, tag_set) -> SavedGraph`` accepts

* a directory: a SavedModel (``saved_model.pb`` or ``saved_model.pbtxt``); the MetaGraph
  whose tags are ``tag_set`` is the one converted (the only one when there is one);
* ``*.pb`` / ``*.pbtxt``: a binary / text ``GraphDef`` (a frozen graph);
* ``*.meta``: a ``MetaGraphDef`` (binary, or text as ``export_meta_graph(as_text=True)``
  writes it).

Anything else raises ``ConversionError`` naming what the file holds and what to do:
a missing path, a file that is no graph, a truncated file (the byte where parsing
stopped), content that disagrees with the extension (a SavedModel named ``model.pb``,
a text GraphDef named ``.pb``, ...), an unknown tag set.

The input is only ever opened for reading (``writer`` writes outputs).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from google.protobuf import message as pb_message
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from ..errors import ConversionError

GRAPHDEF, METAGRAPH, SAVEDMODEL = "GraphDef", "MetaGraph", "SavedModel"
GRAPH_EXTENSIONS = {".pb": (GRAPHDEF, False), ".pbtxt": (GRAPHDEF, True), ".meta": (METAGRAPH, False)}
SAVED_MODEL_FILES = (("saved_model.pb", False), ("saved_model.pbtxt", True))
_MESSAGES = {GRAPHDEF: graph_pb2.GraphDef, METAGRAPH: meta_graph_pb2.MetaGraphDef,
             SAVEDMODEL: saved_model_pb2.SavedModel}
_NODE_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\-/>]*$")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_>.]*$")
_DEFAULT_TAGS = "serve"


@dataclass
class SavedGraph:
    """A graph read from disk, with the container it came in.

    ``graph_def`` is the graph to convert; for a MetaGraph or SavedModel it is the
    ``graph_def`` field of ``meta_graph`` (the chosen MetaGraph of ``saved_model``).
    """

    path: str
    kind: str                                   # GRAPHDEF, METAGRAPH or SAVEDMODEL
    text: bool                                  # text protobuf encoding
    graph_def: graph_pb2.GraphDef
    meta_graph: Optional[meta_graph_pb2.MetaGraphDef] = None
    saved_model: Optional[saved_model_pb2.SavedModel] = None
    meta_graph_index: int = 0
    graph_file: str = ""                        # the file holding the graph
    tags: Tuple[str, ...] = ()

    @property
    def signatures(self) -> Dict[str, object]:
        """Signature key -> SignatureDef (empty for a frozen GraphDef)."""
        return dict(self.meta_graph.signature_def) if self.meta_graph is not None else {}

    @property
    def size(self) -> int:
        """Bytes on disk: the graph file, plus a SavedModel's variables and assets."""
        if self.kind != SAVEDMODEL:
            return os.path.getsize(self.graph_file)
        return directory_size(self.path)

    def describe(self, output: Optional[str] = None) -> str:
        """What this saved graph is, or (``output``) what its conversion written there is: a
        GraphDef takes its output's format from the extension."""
        if self.kind == SAVEDMODEL:
            return "SavedModel (tags %s)" % ",".join(self.tags)
        text = self.text
        if output is not None and self.kind == GRAPHDEF:
            text = output.lower().endswith(".pbtxt")
        return "%s (%s)" % (self.kind, "text" if text else "binary")


def directory_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


# -- reading ----------------------------------------------------------------------------
def read_saved_graph(path: str, tag_set: Optional[str] = None) -> SavedGraph:
    """Reads ``path`` (see module docstring); raises ConversionError for anything else."""
    if not os.path.exists(path):
        raise ConversionError("%s does not exist" % path,
                              "Check the path (INPUT is a .pb, .pbtxt or .meta file or a "
                              "SavedModel directory)")
    if os.path.isdir(path):
        return _read_saved_model(path, tag_set)
    if tag_set is not None:
        raise ConversionError("--tag-set applies to SavedModel directories, but %s is a file" % path,
                              "Drop --tag-set, or pass the SavedModel's directory")
    base = os.path.basename(path)
    if base in dict(SAVED_MODEL_FILES):
        raise ConversionError("%s is the graph file of a SavedModel" % path,
                              "Pass its directory %s instead" % (os.path.dirname(path) or "."))
    extension = os.path.splitext(base)[1].lower()
    if extension not in GRAPH_EXTENSIONS:
        raise ConversionError(
            "%s has an unknown extension %r" % (path, extension),
            "Name a frozen GraphDef .pb (binary) or .pbtxt (text), a MetaGraph .meta, or pass a "
            "SavedModel directory")
    kind, text = GRAPH_EXTENSIONS[extension]
    data = _read_bytes(path)
    parsed, text = _parse_expected(path, data, kind, text)
    if kind == GRAPHDEF:
        return SavedGraph(path, kind, text, parsed, graph_file=path)
    return SavedGraph(path, kind, text, parsed.graph_def, meta_graph=parsed, graph_file=path)


def read_graph_file(path: str, text: bool):
    """The GraphDef in ``path`` (a file this module wrote or checked), binary or text."""
    graph_def = graph_pb2.GraphDef()
    data = _read_bytes(path)
    if text:
        text_format.Parse(data.decode("utf-8"), graph_def)
    else:
        graph_def.ParseFromString(data)
    return graph_def


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise ConversionError("cannot read %s (%s)" % (path, error.strerror),
                              "Check the file's permissions") from None


def _read_saved_model(path: str, tag_set: Optional[str]) -> SavedGraph:
    found = [(os.path.join(path, name), text) for name, text in SAVED_MODEL_FILES
             if os.path.isfile(os.path.join(path, name))]
    if not found:
        raise ConversionError(
            "%s is a directory but not a SavedModel (it has no saved_model.pb)" % path,
            "Pass a SavedModel directory, a frozen GraphDef .pb/.pbtxt or a MetaGraph .meta file")
    graph_file, text = found[0]
    saved_model, _ = _parse_expected(graph_file, _read_bytes(graph_file), SAVEDMODEL, text)
    index, tags = _choose_meta_graph(path, saved_model, tag_set)
    meta_graph = saved_model.meta_graphs[index]
    return SavedGraph(path, SAVEDMODEL, text, meta_graph.graph_def, meta_graph=meta_graph,
                      saved_model=saved_model, meta_graph_index=index, graph_file=graph_file,
                      tags=tags)


def _choose_meta_graph(path: str, saved_model, tag_set: Optional[str]) -> Tuple[int, Tuple[str, ...]]:
    available = [tuple(meta.meta_info_def.tags) for meta in saved_model.meta_graphs]
    if tag_set is None and len(available) == 1:
        return 0, available[0]
    wanted = set(_split_tags(tag_set if tag_set is not None else _DEFAULT_TAGS))
    for index, tags in enumerate(available):
        if set(tags) == wanted:
            return index, tags
    raise ConversionError(
        "SavedModel %s has no MetaGraph with tag set %r (it has %s)" % (
            path, ",".join(sorted(wanted)), "; ".join(",".join(tags) or "(no tags)" for tags in available)),
        "Pass one of those with --tag-set")


def _split_tags(text: str) -> List[str]:
    return [tag.strip() for tag in text.split(",") if tag.strip()]


def _parse_expected(path: str, data: bytes, kind: str, text: bool):
    """Parses ``data`` as ``kind``; on failure says what the file really is."""
    parsed, problem = _parse(data, kind, text)
    if parsed is not None:
        return parsed, text
    for other_kind, other_text in _candidates(kind, text):
        other, _ = _parse(data, other_kind, other_text)
        if other is not None:
            raise ConversionError(*_disagreement(path, kind, text, other_kind, other_text))
    raise ConversionError("%s is not a %s%s (%s)" % (path, "text " if text else "", kind, problem),
                          "Copy or export it again" if "truncated" in problem else _what_to_pass(kind))


def _candidates(kind: str, text: bool):
    for other_kind in (GRAPHDEF, METAGRAPH, SAVEDMODEL):
        for other_text in (text, not text):
            if (other_kind, other_text) != (kind, text):
                yield other_kind, other_text


def _parse(data: bytes, kind: str, text: bool):
    """``(message, None)`` if ``data`` is a plausible ``kind``, else ``(None, why not)``."""
    message = _MESSAGES[kind]()
    if text:
        try:
            text_format.Parse(data.decode("utf-8"), message)
        except UnicodeDecodeError as error:
            return None, "not UTF-8 text: byte %d" % error.start
        except text_format.ParseError as error:
            return None, _text_parse_problem(error, data)
    else:
        try:
            message.ParseFromString(data)
        except pb_message.DecodeError:
            offset, truncated = first_bad_byte(data)
            return None, "%sprotobuf parse failed at byte %s of %d" % (
                "it looks truncated: " if truncated else "", "?" if offset is None else offset, len(data))
    graphs = _graphs_of(message, kind)
    if not graphs:
        return None, "it holds no %s" % ("MetaGraph" if kind == SAVEDMODEL else "nodes")
    for graph in graphs:
        problem = implausible_graph(graph)
        if problem:
            return None, problem
    return message, None


def _graphs_of(message, kind: str):
    if kind == GRAPHDEF:
        return [message] if message.node else []
    if kind == METAGRAPH:
        return [message.graph_def] if message.graph_def.node else []
    return [meta.graph_def for meta in message.meta_graphs]


def implausible_graph(graph_def) -> Optional[str]:
    """Why ``graph_def`` is not a usable graph (None if it is one).

    Protobuf parses many byte strings "successfully" as the wrong message; real graphs have
    nodes with valid names and op types whose inputs all exist.
    """
    if not graph_def.node:
        return "it holds no nodes"
    names = set()
    for node in graph_def.node:
        if not _NODE_NAME.match(node.name) or not _OP_NAME.match(node.op):
            return "node %r (op %r) is not a valid TensorFlow node" % (node.name[:40], node.op[:40])
        names.add(node.name)
    for node in graph_def.node:
        for text in node.input:
            source = text[1:] if text.startswith("^") else text.split(":")[0]
            if source not in names:
                return ("node %r has input %r but there is no node %r: the file looks truncated "
                        "or incomplete" % (node.name, text, source))
    return None


def _text_parse_problem(error, data: bytes) -> str:
    """Where text-format parsing stopped, shortly: its message quotes the offending line,
    which for a Const is the whole of its tensor_content."""
    line = getattr(error, "GetLine", lambda: None)()
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    if line is not None and line >= lines:
        return "it looks truncated: text format parse failed in its last line (%d)" % line
    detail = str(error).split(" : ", 1)[-1]
    detail = detail if len(detail) <= 120 else detail[:117] + "..."
    return "text format parse failed%s: %s" % ("" if line is None else " at line %d" % line, detail)


def first_bad_byte(data: bytes) -> Tuple[Optional[int], bool]:
    """``(offset, runs past the end)`` of the first malformed top-level protobuf field,
    or ``(None, False)`` when the top level is well formed."""
    position, size = 0, len(data)
    while position < size:
        start = position
        tag, position = _varint(data, position)
        if tag is None or tag >> 3 == 0:
            return start, tag is None and position >= size
        wire_type = tag & 7
        if wire_type == 0:
            value, position = _varint(data, position)
            if value is None:
                return start, position >= size
        elif wire_type == 2:
            length, position = _varint(data, position)
            if length is None:
                return start, position >= size
            position += length
        elif wire_type in (1, 5):
            position += 8 if wire_type == 1 else 4
        else:
            return start, False
        if position > size:
            return start, True
    return None, False


def _varint(data: bytes, position: int):
    result, shift = 0, 0
    while position < len(data) and shift < 64:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
    return None, position


def _disagreement(path: str, kind: str, text: bool, actual: str, actual_text: bool):
    problem = "%s holds a %s %s, not the %s %s its extension says" % (
        path, "text" if actual_text else "binary", actual, "text" if text else "binary", kind)
    if actual == SAVEDMODEL:
        return problem, ("Put it in a directory as saved_model.%s (with its variables/) and pass "
                         "the directory" % ("pbtxt" if actual_text else "pb"))
    extension = {(GRAPHDEF, False): ".pb", (GRAPHDEF, True): ".pbtxt"}.get((actual, actual_text), ".meta")
    return problem, "Rename it to %s%s" % (os.path.splitext(path)[0], extension)


def _what_to_pass(kind: str) -> str:
    if kind == GRAPHDEF:
        return ("Pass a frozen GraphDef; if it is a SavedModel, pass its directory; if it is a "
                "MetaGraph, use the .meta file")
    if kind == METAGRAPH:
        return "Pass a MetaGraphDef written by tf.compat.v1.train.export_meta_graph or a Saver"
    return "Re-export the SavedModel; a partial copy cannot be converted"

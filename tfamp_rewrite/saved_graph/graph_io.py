"""The inputs and outputs of a saved graph, and what keep-io-types does to them.

``resolve_io(saved, inputs, outputs, signature) -> GraphIO``:

* SavedModel: the chosen signature's inputs and outputs (``--signature-def``, else
  ``serving_default``, else the only / first one); every signature's tensors are
  boundaries.
* MetaGraph: ``--inputs`` / ``--outputs`` if given, else its signatures like a
  SavedModel, else as a frozen graph.
* frozen GraphDef: ``--inputs`` / ``--outputs`` if given, else the Placeholders and the
  sink nodes (consumed by nothing; NoOp, Assert, Save and unused Consts excluded).

Nodes the container needs unchanged (the Saver's save/restore nodes, init / main ops)
are listed in ``GraphIO.kept`` and are always preserved.

With keep-io-types the boundary nodes are passed to the rewrite as feeds / fetches, so they
keep float32 and Casts sit at the boundary.  Without it, ``release_inputs`` turns float32
Placeholders whose every consumer is a half Cast of the rewrite into half Placeholders
(the Casts go), and outputs keep whatever dtype the pass gave their nodes;
``update_signatures`` then writes the new dtypes into the signatures.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

from ..dtypes import DT_FLOAT, dtype_name
from ..errors import ConversionError, GraphRewriteError
from ..graph_rewrite.graph_view import GraphView, parse_input
from ..tf_compat import lookup_op_def
from .formats import GRAPHDEF, SAVEDMODEL, SavedGraph

_NOT_OUTPUTS = frozenset({"Const", "VarHandleOp", "VariableV2", "Variable", "Print"})
_FLOATING = frozenset({1, 2, 14, 19})  # float32, float64, bfloat16, float16
# ... and the integer and bool types: what an output may hold (class ids, counts, masks).
_NUMERIC = _FLOATING | frozenset({3, 4, 5, 6, 9, 10, 17, 22, 23})
_KEPT_COLLECTIONS = ("saved_model_main_op", "legacy_init_op", "init_op", "table_initializer",
                     "saved_model_train_op")


@dataclass
class GraphTensor:
    """One input or output: its signature key (or tensor name), tensor, dtypes and shape."""

    key: str
    tensor: str
    dtype: str
    converted_dtype: str = ""
    shape: Optional[List[Optional[int]]] = None


@dataclass
class GraphIO:
    """The inputs and outputs conversion keeps, and which signature they come from."""

    inputs: List[GraphTensor] = field(default_factory=list)
    outputs: List[GraphTensor] = field(default_factory=list)
    signature: Optional[str] = None
    boundary_inputs: List[str] = field(default_factory=list)   # every signature's input nodes
    boundary_outputs: List[str] = field(default_factory=list)  # every signature's output nodes
    kept: List[str] = field(default_factory=list)              # Saver / init nodes


def resolve_io(saved: SavedGraph, inputs: Sequence[str] = (), outputs: Sequence[str] = (),
               signature: Optional[str] = None) -> GraphIO:
    """The GraphIO of ``saved`` (see module docstring); ConversionError for unknown names."""
    if saved.kind == SAVEDMODEL and (inputs or outputs):
        raise ConversionError("--inputs/--outputs apply to frozen graphs and MetaGraphs; a SavedModel's "
                              "come from its signatures", "Use --signature-def to choose a signature")
    if saved.kind == GRAPHDEF and signature is not None:
        raise ConversionError("--signature-def applies to SavedModels and MetaGraphs; %s is a frozen "
                              "GraphDef" % saved.path, "Use --inputs/--outputs to name its tensors")
    nodes = {node.name: node for node in saved.graph_def.node}
    dtypes = TensorDtypes(saved.graph_def)
    if not inputs and not outputs and saved.signatures:
        io = _from_signatures(saved, signature)
    else:
        if signature is not None and saved.signatures:
            raise ConversionError("--signature-def cannot be combined with --inputs/--outputs",
                                  "Pass one or the other")
        input_names = list(inputs) or [n.name for n in saved.graph_def.node if n.op == "Placeholder"]
        output_names = list(outputs) or sink_nodes(saved.graph_def, dtypes)
        if not output_names:
            raise ConversionError("%s has no node that nothing consumes, so it has no obvious output" %
                                  saved.path, "Name the outputs with --outputs")
        io = GraphIO(inputs=[_tensor(name, nodes, dtypes, "--inputs", saved.path) for name in input_names],
                     outputs=[_tensor(name, nodes, dtypes, "--outputs", saved.path) for name in output_names])
        io.boundary_inputs = [parse_input(t.tensor)[0] for t in io.inputs]
        io.boundary_outputs = [parse_input(t.tensor)[0] for t in io.outputs]
    io.kept = [name for name in _container_nodes(saved) if name in nodes]
    return io


def _from_signatures(saved: SavedGraph, wanted: Optional[str]) -> GraphIO:
    signatures = saved.signatures
    if wanted is None:
        wanted = "serving_default" if "serving_default" in signatures else sorted(signatures)[0]
    elif wanted not in signatures:
        raise ConversionError("%s has no signature %r (it has %s)" % (
            saved.path, wanted, ", ".join(sorted(signatures))), "Pass one of those with --signature-def")
    io = GraphIO(signature=wanted)
    chosen = signatures[wanted]
    io.inputs = [_from_tensor_info(key, info) for key, info in sorted(chosen.inputs.items())]
    io.outputs = [_from_tensor_info(key, info) for key, info in sorted(chosen.outputs.items())]
    for signature in signatures.values():
        io.boundary_inputs.extend(parse_input(i.name)[0] for i in signature.inputs.values() if i.name)
        io.boundary_outputs.extend(parse_input(o.name)[0] for o in signature.outputs.values() if o.name)
    return io


def _from_tensor_info(key: str, info) -> GraphTensor:
    shape = None
    if not info.tensor_shape.unknown_rank:
        shape = [d.size if d.size >= 0 else None for d in info.tensor_shape.dim]
    return GraphTensor(key, info.name, dtype_name(info.dtype), shape=shape)


def _tensor(name: str, nodes, dtypes: "TensorDtypes", option: str, path: str) -> GraphTensor:
    try:
        node_name, port = parse_input(name)
    except ValueError:
        node_name, port = name, -1
    if node_name not in nodes or port < 0:
        close = difflib.get_close_matches(node_name, list(nodes), n=3)
        raise ConversionError("%s %r is not a node of %s" % (option, name, path),
                              "Nodes with similar names: %s" % ", ".join(close) if close else
                              "List node names with: tfamp-rewrite explain %s --all-nodes" % path)
    tensor = "%s:%d" % (node_name, port)
    node = nodes[node_name]
    shape = None
    if node.op == "Placeholder" and "shape" in node.attr and not node.attr["shape"].shape.unknown_rank:
        shape = [d.size if d.size >= 0 else None for d in node.attr["shape"].shape.dim]
    try:
        dtype = dtypes.of(tensor)
    except GraphRewriteError:
        raise ConversionError("%s %r: node %r (%s) has no output %d" % (
            option, name, node_name, node.op, port),
                              "Name an existing output, such as %s:0" % node_name) from None
    return GraphTensor(name, tensor, dtype_name(dtype), shape=shape)


def sink_nodes(graph_def, dtypes: "TensorDtypes") -> List[str]:
    """Nodes nothing consumes (by data or control) whose first output is numeric (floating,
    integer or bool: an argmax's class ids count), except Const, variables and Print; a
    Saver's string outputs and ops without outputs are not outputs either."""
    consumed = {parse_input(text)[0] for node in graph_def.node for text in node.input}
    return [node.name for node in graph_def.node
            if node.name not in consumed and node.op not in _NOT_OUTPUTS
            and dtypes.get(node.name + ":0") in _NUMERIC]


def _container_nodes(saved: SavedGraph) -> List[str]:
    meta = saved.meta_graph
    if meta is None:
        return []
    names = []
    saver = meta.saver_def
    for tensor in (saver.filename_tensor_name, saver.save_tensor_name, saver.restore_op_name):
        if tensor:
            names.append(parse_input(tensor)[0])
    for key in _KEPT_COLLECTIONS:
        if key in meta.collection_def:
            names.extend(parse_input(text)[0] for text in meta.collection_def[key].node_list.value)
    return names


class TensorDtypes:
    """``of("node:port")``: the DataType enum of a tensor of ``graph_def``, as it is now."""

    def __init__(self, graph_def):
        signatures = {f.signature.name: f.signature for f in graph_def.library.function}
        self.view = GraphView(graph_def, lambda op: lookup_op_def(op) or signatures.get(op))

    def of(self, tensor: str) -> int:
        name, port = parse_input(tensor)
        node = self.view.index[name]
        return self.view.vertex_dtype[self.view.output_vertex(node, port)]

    def get(self, tensor: str) -> Optional[int]:
        """``of(tensor)``, or None when there is no such tensor (e.g. an init op's NoOp)."""
        try:
            return self.of(tensor)
        except (GraphRewriteError, KeyError, ValueError):
            return None

    def is_floating(self, tensor: str) -> bool:
        """True if ``tensor`` exists and is float16/32/64 or bfloat16."""
        return self.get(tensor) in _FLOATING


def release_inputs(graph_def, inputs: Iterable[GraphTensor], casts) -> List[str]:
    """Float32 input Placeholders feeding only half Casts become half (see module docstring).

    ``casts`` are the report's CastInfo records.  Returns the names of the released inputs.
    """
    by_source: Dict[str, List[object]] = {}
    for cast in casts:
        if cast.to_dtype != "float32" and cast.port == 0:
            by_source.setdefault(cast.source, []).append(cast)
    nodes = {node.name: node for node in graph_def.node}
    released, removed = [], {}
    for tensor in inputs:
        name = parse_input(tensor.tensor)[0]
        node = nodes.get(name)
        if node is None or node.op != "Placeholder" or node.attr["dtype"].type != DT_FLOAT:
            continue
        cast_names = {cast.name for cast in by_source.get(name, ())}
        consumers = [other for other in graph_def.node
                     if any(parse_input(text)[0] == name for text in other.input)]
        if not cast_names or any(other.name not in cast_names for other in consumers):
            continue
        node.attr["dtype"].type = nodes[next(iter(cast_names))].attr["DstT"].type
        removed.update(dict.fromkeys(cast_names, name))
        released.append(name)
    if removed:
        bypass_nodes(graph_def, removed)
    return released


def bypass_nodes(graph_def, replacements: Dict[str, str]) -> None:
    """Removes the nodes named in ``replacements``, rewiring their consumers to the value."""
    for node in graph_def.node:
        for slot, text in enumerate(node.input):
            source, port = parse_input(text)
            if source in replacements:
                node.input[slot] = ("^" if port < 0 else "") + replacements[source]
    kept = [node for node in graph_def.node if node.name not in replacements]
    del graph_def.node[:]
    graph_def.node.extend(kept)


def record_converted_dtypes(io: GraphIO, graph_def) -> None:
    """Fills ``converted_dtype`` of every input and output from the converted graph."""
    dtypes = TensorDtypes(graph_def)
    for tensor in io.inputs + io.outputs:
        dtype = dtypes.get(tensor.tensor)
        tensor.converted_dtype = tensor.dtype if dtype is None else dtype_name(dtype)


def update_signatures(meta_graph, graph_def) -> None:
    """Writes the converted graph's dtypes into every signature's TensorInfos (tensors only)."""
    dtypes = TensorDtypes(graph_def)
    for signature in meta_graph.signature_def.values():
        for info in list(signature.inputs.values()) + list(signature.outputs.values()):
            dtype = dtypes.get(info.name) if info.name else None
            if dtype is not None:
                info.dtype = dtype

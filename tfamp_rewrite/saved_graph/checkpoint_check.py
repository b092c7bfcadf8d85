"""Will a SavedModel's variables restore?  Checked without running any of its graph.

Conversion copies ``variables/`` unchanged, so a SavedModel whose variables cannot be
restored would be converted into one that does not load either.  ``check_variables(saved)``
reads the checkpoint the way restoring does and compares it with what the graph restores::

    the checkpoint (variables/variables.index and its data shards) opens, if there is one
    for every RestoreV2 node (of the graph, or of a function: TF2's restore function):
        its tensor_names / shape_and_slices Consts and dtypes attr name what it restores
        every name is in the checkpoint, with the dtype the node restores
        every whole tensor reads back (sizes and checksums are verified on read)
    the Saver's restore op reads no variable: variables are uninitialised while it runs

Problems are one ``ConversionError`` line naming the variable.  Frozen graphs and
MetaGraphs have no checkpoint to check here.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

from ..dtypes import dtype_name
from ..errors import ConversionError
from ..tf_compat import lookup_op_def
from .formats import SAVEDMODEL
from .op_def_check import node_ports

_RESTORE_OPS = frozenset({"RestoreV2"})
_RESOURCE_VARIABLES = frozenset({"VarHandleOp"})
_REF_VARIABLES = frozenset({"VariableV2", "Variable"})
_RESOURCE_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})
_REF_OFFSET = 100
_FIX = "Re-export the SavedModel; its variables/ directory does not belong to its graph or is damaged"


def check_variables(saved) -> None:
    """Raises ConversionError if the SavedModel ``saved`` (a formats.SavedGraph) cannot restore."""
    if saved.kind != SAVEDMODEL:
        return
    read = variable_read_by_restore(saved.graph_def, saved.meta_graph.saver_def.restore_op_name)
    if read is not None:
        raise ConversionError("SavedModel %s cannot restore: its Saver's restore op reads variable %r "
                              "(node %r) before restoring it" % (saved.path, read[1], read[0]),
                              "Re-export the SavedModel; its Saver is damaged")
    wanted = restored_tensors(saved.graph_def)
    prefix = os.path.join(saved.path, "variables", "variables")
    if not wanted and not os.path.isfile(prefix + ".index"):
        return
    reader = _open(saved.path, prefix)
    stored = reader.get_variable_to_dtype_map()
    for name, (dtype, whole) in sorted(wanted.items()):
        if name not in stored:
            raise ConversionError("SavedModel %s restores variable %r, which its variables/ checkpoint does "
                                  "not hold" % (saved.path, name), _FIX)
        held = stored[name].as_datatype_enum
        if held != dtype:
            raise ConversionError("SavedModel %s restores variable %r as %s, but its variables/ checkpoint "
                                  "holds %s" % (saved.path, name, dtype_name(dtype), dtype_name(held)), _FIX)
        if whole:
            try:
                reader.get_tensor(name)
            except Exception as error:  # the reader raises what the C++ bundle reader reports
                raise ConversionError("SavedModel %s: variable %r does not read back from variables/ (%s)" % (
                    saved.path, name, _first_line(error)), _FIX) from None


def restored_tensors(graph_def) -> Dict[str, Tuple[int, bool]]:
    """Checkpoint key -> (dtype restored, whole tensor) for every RestoreV2 node of the graph
    and of its functions."""
    wanted: Dict[str, Tuple[int, bool]] = {}
    for nodes in [graph_def.node] + [function.node_def for function in graph_def.library.function]:
        consts = {node.name: node for node in nodes if node.op == "Const"}
        for node in nodes:
            if node.op not in _RESTORE_OPS or len(node.input) < 3:
                continue
            names = _strings(consts.get(node.input[1].split(":")[0]))
            slices = _strings(consts.get(node.input[2].split(":")[0]))
            dtypes = list(node.attr["dtypes"].list.type)
            for index, name in enumerate(names):
                if index < len(dtypes):
                    wanted[name] = (dtypes[index], index >= len(slices) or not slices[index])
    return wanted


def variable_read_by_restore(graph_def, restore_op: str) -> Optional[Tuple[str, str]]:
    """``(reading node, variable)`` for a variable the restore op depends on reading, or None.

    A read is a data edge from a ref variable to an input that is not a reference, or from a
    resource variable's handle to an op that reads its value (a function call passing the
    handle on, as TF2's restore does, is not one).
    """
    nodes = {node.name: node for node in graph_def.node}
    pending, seen = [restore_op.split(":")[0].lstrip("^")], set()
    while pending:
        name = pending.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        node = nodes[name]
        data = [text.split(":")[0] for text in node.input if not text.startswith("^")]
        for port, source in enumerate(data):
            variable = nodes.get(source)
            if variable is not None and _reads(node, port, variable):
                return node.name, source
        pending.extend(text.lstrip("^").split(":")[0] for text in node.input)
    return None


def _reads(node, port: int, variable) -> bool:
    if variable.op in _RESOURCE_VARIABLES:
        return node.op in _RESOURCE_READS
    if variable.op not in _REF_VARIABLES:
        return False
    op_def = lookup_op_def(node.op)
    if op_def is None:
        return False
    try:
        inputs = node_ports(node, op_def)[0]
        expected = inputs.dtype(port) if port < inputs.count else None
    except ValueError:
        return False
    return expected is not None and expected < _REF_OFFSET


def _strings(node) -> List[str]:
    if node is None or "value" not in node.attr:
        return []
    return [value.decode("utf-8", "replace") for value in node.attr["value"].tensor.string_val]


def _open(path: str, prefix: str):
    import tensorflow as tf

    if not os.path.isfile(prefix + ".index"):
        raise ConversionError("SavedModel %s restores variables but has no variables/variables.index" % path,
                              "Copy the whole SavedModel directory, variables/ included")
    try:
        return tf.compat.v1.train.NewCheckpointReader(prefix)
    except Exception as error:
        raise ConversionError("SavedModel %s: its variables/ checkpoint cannot be read (%s)" % (
            path, _first_line(error)), _FIX) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]

"""Graphs an older TensorFlow can read: default-valued attributes left out.

TensorFlow adds attributes to existing ops only with a default value, and a newer
TensorFlow writes them into every NodeDef: TF 2.x's FusedBatchNormV3 carries
``exponential_avg_factor``, MaxPool ``explicit_paddings``, VarHandleOp ``allowed_devices``.
TF 1.15's importer rejects an attribute it does not know ("NodeDef mentions attr
'exponential_avg_factor' not in Op<name=FusedBatchNormV3 ...>") but fills in the default of
one that is missing.  So a graph without its default-valued attributes means the same to
both, which is how TensorFlow's own ``strip_default_attrs`` export option makes graphs for
older consumers.

``strip_default_attrs(graph_def, lookup_op_def) -> int`` removes, from every node and
every function body's node, each attribute whose value equals its op's default, and
returns how many it removed.  Ops ``lookup_op_def`` does not know are left alone.

``strip_debug_names(graph_def) -> int`` removes the ``debug_name`` TF 2.x gives resource
variables (``VarHandleOp``): it names the variable in error messages only, and 1.15's op
has no such attribute.

Nothing helps with ops an older TensorFlow lacks, nor with another new attribute set to a
non-default value: those graphs stay unreadable.

The rewrite applies it for ``compat="tf1.15"``.  A graph written by TensorFlow 1.15 itself
needs nothing: the rewrite only changes type attributes and adds Casts whose attributes
(SrcT, DstT, Truncate) TF 1.15 knows.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional


def strip_default_attrs(graph_def, lookup_op_def: Callable[[str], Optional[object]]) -> int:
    """Removes default-valued attributes in place (see the module docstring); returns the count."""
    defaults = {}
    removed = 0
    for node in _all_nodes(graph_def):
        if node.op not in defaults:
            op_def = lookup_op_def(node.op)
            defaults[node.op] = [] if op_def is None else [
                (attr.name, attr.default_value) for attr in op_def.attr
                if attr.HasField("default_value")]
        for name, default in defaults[node.op]:
            if name in node.attr and node.attr[name] == default:
                del node.attr[name]
                removed += 1
    return removed


# op type -> attributes newer TensorFlow sets for its messages alone
_DEBUG_ONLY_ATTRS = {"VarHandleOp": ("debug_name",)}


def strip_debug_names(graph_def) -> int:
    """Removes the message-only attributes of ``_DEBUG_ONLY_ATTRS`` in place; returns the count."""
    removed = 0
    for node in _all_nodes(graph_def):
        for name in _DEBUG_ONLY_ATTRS.get(node.op, ()):
            if name in node.attr:
                del node.attr[name]
                removed += 1
    return removed


def _all_nodes(graph_def) -> Iterator[object]:
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def

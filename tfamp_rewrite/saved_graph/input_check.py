"""Refusing invalid input before anything is rewritten: one entry point for ``convert``.

``check_input(saved, acknowledged_ops) -> warnings`` runs, in this order (cheapest and
clearest message first; the first problem is a ``ConversionError``, one line)::

    op_def_check.check_nodes       every node against its OpDef, the library's function bodies
    import_check.check_importable  TensorFlow's own importer (shape functions, collections, Saver)
    checkpoint_check               a SavedModel's variables restore

``acknowledged_ops`` are op types the user named (``--op-types-to-exclude``): an unregistered one
of them is the user's custom op, not a typo.
"""
from __future__ import annotations

from typing import Iterable, List

from .checkpoint_check import check_variables
from .import_check import check_importable
from .op_def_check import check_nodes


def check_input(saved, acknowledged_ops: Iterable[str] = ()) -> List[str]:
    """Raises ConversionError if ``saved`` (a formats.SavedGraph) is invalid; returns warnings."""
    warnings = check_nodes(saved.graph_def, saved.path, acknowledged_ops)
    check_importable(saved)
    check_variables(saved)
    return warnings

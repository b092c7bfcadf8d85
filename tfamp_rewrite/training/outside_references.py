"""What a GraphDef of added nodes says about nodes outside it, set aside across an import.

A session imports the nodes a user adds after its first run beside those imported before,
under the same names (``import_graph_def(name="")``).  The importer resolves data inputs
to earlier nodes through ``input_map``, but not the other two kinds of reference:

* control inputs (``^init`` in a ``tf.group`` built late): ``input_map`` may name ops only
  when the import has a name scope;
* colocation constraints (``_class: loc:@w`` on the Assigns of a Saver built late): the
  importer looks the name up only among the nodes it imports.

``detach`` removes both from the GraphDef, and ``reattach`` adds them to the imported ops
before any session has run them, so the graph runs and places them as the user's does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from ..graph_rewrite.graph_view import parse_input

_COLOCATION_ATTR = "_class"   # a list of b"loc:@<node name>"
_COLOCATION_PREFIX = "loc:@"


@dataclass
class OutsideReferences:
    """By node name: the control inputs and colocation lists that name nodes outside."""

    control_inputs: Dict[str, List[str]] = field(default_factory=dict)
    colocations: Dict[str, List[bytes]] = field(default_factory=dict)

    def reattach(self, graph: tf.Graph) -> None:
        """Adds what ``detach`` removed to the ops of the same names in ``graph``."""
        for name, inputs in self.control_inputs.items():
            graph.get_operation_by_name(name)._add_control_inputs(
                [graph.get_operation_by_name(source) for source in inputs])
        for name, constraints in self.colocations.items():
            value = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=constraints))
            graph.get_operation_by_name(name)._set_attr(_COLOCATION_ATTR, value)


def detach(graph_def) -> OutsideReferences:
    """Removes from ``graph_def`` (in place) the references to nodes outside it; returns them."""
    local = {node.name for node in graph_def.node}
    detached = OutsideReferences()
    for node in graph_def.node:
        outside = [parse_input(text)[0] for text in node.input
                   if text.startswith("^") and parse_input(text)[0] not in local]
        if outside:
            detached.control_inputs[node.name] = outside
            kept = [text for text in node.input if not (text.startswith("^") and text[1:] in outside)]
            del node.input[:]
            node.input.extend(kept)
        constraints = list(node.attr[_COLOCATION_ATTR].list.s) if _COLOCATION_ATTR in node.attr else []
        if any(c.decode()[len(_COLOCATION_PREFIX):] not in local for c in constraints):
            detached.colocations[node.name] = constraints
            del node.attr[_COLOCATION_ATTR]
    return detached

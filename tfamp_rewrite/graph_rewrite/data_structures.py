"""Data-structure ops must agree on one element dtype per object.

A TensorList (or, in TF 1.15, a Stack or TensorArray) is written by some nodes and read
by others; their element-dtype attributes must all be float32 or all be half, so the
painter treats each object's clients as one *group* painted alike, and adds *implicit
edges* writer -> reader so that paint flows through the object as through a tensor.

* ``tensor_list_groups`` (newest TensorFlow): clusters of TensorList nodes connected by
  their variant handles.  A cluster with an ineligible member, or whose handles reach a
  graph boundary (``_Arg``, ``Placeholder``, a function call, ...), must stay float32.
* ``stack_and_tensor_array_groups`` (TF 1.15): each ``StackV2`` / ``TensorArrayV3``
  object with the push/pop, write/read nodes found by following their input 0 upwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ..dtypes import DT_FLOAT, DT_VARIANT
from .graph_view import GraphView

TENSOR_LIST_READERS = frozenset({
    "TensorListConcat", "TensorListConcatV2", "TensorListGather", "TensorListGetItem",
    "TensorListPopBack", "TensorListStack"})
TENSOR_LIST_WRITERS = frozenset({
    "TensorListFromTensor", "TensorListPushBack", "TensorListPushBackBatch",
    "TensorListScatter", "TensorListScatterV2", "TensorListScatterIntoExistingList",
    "TensorListSetItem", "TensorListSplit"})
# Ops through which a TensorList handle leaves the graph being rewritten.
GRAPH_BOUNDARY_OPS = frozenset({
    "_Arg", "_Retval", "OptionalFromValue", "OptionalGetValue", "PartitionedCall",
    "Placeholder", "StatefulPartitionedCall"})

# object op -> its element-dtype attribute; client op -> (attribute, is_writer)
_TF115_OBJECTS = {"StackV2": ("elem_type", -1), "TensorArrayV3": ("dtype", -1)}
_TF115_CLIENTS = {
    "StackPushV2": ("StackV2", ("T", -1), True),
    "StackPopV2": ("StackV2", ("elem_type", -1), False),
    "TensorArrayWriteV3": ("TensorArrayV3", ("T", -1), True),
    "TensorArrayScatterV3": ("TensorArrayV3", ("T", -1), True),
    "TensorArraySplitV3": ("TensorArrayV3", ("T", -1), True),
    "TensorArrayReadV3": ("TensorArrayV3", ("dtype", -1), False),
    "TensorArrayGatherV3": ("TensorArrayV3", ("dtype", -1), False),
    "TensorArrayConcatV3": ("TensorArrayV3", ("dtype", -1), False),
}


@dataclass
class DataStructureGroups:
    """What the painter needs: groups to paint alike, edges to add, vertices to deny."""

    groups: List[List[int]] = field(default_factory=list)
    implicit_edges: List[Tuple[int, int]] = field(default_factory=list)
    # vertex -> why it must stay float32
    deny: Dict[int, str] = field(default_factory=dict)


def tensor_list_float_vertex(view: GraphView, node: int) -> Optional[int]:
    """The float32 element-dtype vertex of a TensorList node, else None."""
    if "TensorList" not in view.ops[node]:
        return None
    for (name, index), vertex in view.vertices[node].items():
        if name and index < 0 and view.vertex_dtype[vertex] == DT_FLOAT:
            return vertex
    return None


def tensor_list_groups(view: GraphView, eligible: Sequence[bool]) -> DataStructureGroups:
    """Clusters of float32 TensorList nodes connected through their handles."""
    result = DataStructureGroups()
    seen: Set[int] = set()
    for node in range(len(view.nodes)):
        root = view.vertices[node].get(("", DT_VARIANT))
        if (root is None or root in seen or not eligible[node]
                or tensor_list_float_vertex(view, node) is None):
            continue
        members, unsafe_because = _handle_cluster(view, root, eligible, seen)
        group = [tensor_list_float_vertex(view, m) for m in members]
        result.groups.append(group)
        if unsafe_because:
            for vertex in group:
                result.deny[vertex] = unsafe_because
        result.implicit_edges.extend(_writer_reader_edges(view, members, eligible))
    return result


def _handle_cluster(view: GraphView, root: int, eligible, seen: Set[int]):
    """Members of the handle-connected cluster of ``root`` and why it is unsafe (or None)."""
    members: Dict[int, None] = {}  # ordered set
    problems: List[str] = []
    stack = [root]
    seen.add(root)
    while stack:
        vertex = stack.pop()
        node = view.vertex_node[vertex]
        name, op = view.nodes[node].name, view.ops[node]
        if tensor_list_float_vertex(view, node) is not None:
            members[node] = None
            if not eligible[node]:
                problems.append("its TensorList cluster contains %r, which is not converted" % name)
        elif op in GRAPH_BOUNDARY_OPS or op in view.function_ops or view.op_defs[node] is None:
            problems.append("its TensorList handle crosses a graph boundary at %r (%s)" % (name, op))
            if view.op_defs[node] is None:
                continue  # an unknown op's opaque vertex joins unrelated tensors
        for neighbour in view.fanin[vertex] + view.fanout[vertex]:
            if neighbour not in seen:
                seen.add(neighbour)
                stack.append(neighbour)
    return list(members), (problems[0] if problems else None)


def _writer_reader_edges(view: GraphView, members: List[int], eligible):
    """Implicit float edges from every writer upstream of a reader's handle to the reader."""
    edges = []
    for reader in members:
        if view.ops[reader] not in TENSOR_LIST_READERS or not eligible[reader]:
            continue
        reader_vertex = tensor_list_float_vertex(view, reader)
        start = view.vertices[reader][("", DT_VARIANT)]
        visited = {start}
        stack = [start]
        while stack:
            vertex = stack.pop()
            node = view.vertex_node[vertex]
            if view.ops[node] in TENSOR_LIST_WRITERS:
                writer_vertex = tensor_list_float_vertex(view, node)
                if writer_vertex is not None:
                    edges.append((writer_vertex, reader_vertex))
            for upstream in view.fanin[vertex]:
                if upstream not in visited and eligible[view.vertex_node[upstream]]:
                    visited.add(upstream)
                    stack.append(upstream)
    return edges


def stack_and_tensor_array_groups(view: GraphView) -> DataStructureGroups:
    """TF 1.15: each Stack / TensorArray object with its writers and readers."""
    result = DataStructureGroups()
    clients: Dict[int, Tuple[List[int], List[int]]] = {}
    for node, op in enumerate(view.ops):
        spec = _TF115_CLIENTS.get(op)
        if spec is None:
            continue
        object_op, type_attr, is_writer = spec
        vertex = view.vertices[node].get(type_attr)
        if vertex is None:
            continue
        obj = _object_of(view, node, object_op)
        if obj is None:
            result.deny[vertex] = "no %s found upstream of its handle input" % object_op
            continue
        writers, readers = clients.setdefault(obj, ([], []))
        (writers if is_writer else readers).append(vertex)
    for obj, (writers, readers) in clients.items():
        object_vertex = view.vertices[obj].get(_TF115_OBJECTS[view.ops[obj]])
        group = writers + readers + ([object_vertex] if object_vertex is not None else [])
        result.groups.append(group)
        result.implicit_edges.extend((w, r) for w in writers for r in readers)
    return result


def _object_of(view: GraphView, node: int, object_op: str) -> Optional[int]:
    """Follows input 0 upwards (through Enter, Identity, ...) to the data-structure object."""
    seen = set()
    current = view.regular_input_node(node, 0)
    while current is not None and current not in seen:
        if view.ops[current] == object_op:
            return current
        seen.add(current)
        current = view.regular_input_node(current, 0)
    return None


def force_color_match(groups: List[List[int]], allow: Set[int], deny: Set[int]
                      ) -> List[Tuple[int, str, int]]:
    """Paints every group all deny (if any member is deny) or all allow (if any is allow).

    Returns ``(vertex, "allow" | "deny", sibling)`` for each vertex whose colour changed,
    ``sibling`` being the member that decided the group's colour.
    """
    changes = []
    for group in groups:
        decider = next((v for v in group if v in deny), None)
        colour = "deny"
        if decider is None:
            decider = next((v for v in group if v in allow), None)
            colour = "allow"
        if decider is None:
            continue
        for vertex in group:
            if colour == "deny":
                allow.discard(vertex)
                if vertex not in deny:
                    deny.add(vertex)
                    changes.append((vertex, colour, decider))
            elif vertex not in allow:
                allow.add(vertex)
                changes.append((vertex, colour, decider))
    return changes

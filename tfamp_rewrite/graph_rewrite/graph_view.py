"""An index of a GraphDef for the painting passes.

The painter does not colour nodes but *type attributes of nodes*, as Grappler's pass
does: a vertex is ``(node, TypeAttr)`` where ``TypeAttr`` is

* ``("T", -1)``  a ``type`` attribute;
* ``("T", i)``   element ``i`` of a ``list(type)`` attribute;
* ``("", dtype)`` all ports of one fixed dtype (e.g. the ``int32`` shape input of
  ``Conv2DBackpropInput``); paint propagates through such vertices but never changes them.

Every input and output port maps to one vertex; attributes with no port (``StackV2``'s
``elem_type``) are vertices too.  An edge joins the vertex of a producer's output port
to the vertex of the consumer's input port.  Nodes of unknown ops get one opaque vertex
whose dtype is unknown: they are float32 boundaries.

``GraphView(graph_def, lookup_op_def, function_ops)`` indexes ``graph_def`` in place (it keeps
references to its NodeDefs, so it must index the copy that will be rewritten) and raises
``GraphRewriteError`` for duplicate names, dangling inputs, wrong input counts and
cycles that do not pass through ``NextIteration``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from ..dtypes import DT_INVALID
from ..errors import GraphRewriteError

TypeAttr = Tuple[str, int]
UNKNOWN_ATTR: TypeAttr = ("", DT_INVALID)
_LOOP_BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})


class _OpLayout:
    """How an op's ports map to type attributes, derived once per op type."""

    def __init__(self, op_def):
        self.op_def = op_def
        self.inputs = [self._arg_spec(arg) for arg in op_def.input_arg]
        self.outputs = [self._arg_spec(arg) for arg in op_def.output_arg]
        # Attributes whose values change how many ports there are.
        self.count_attrs = tuple(sorted(
            {spec[2] for spec in self.inputs + self.outputs if spec[2]}
            | {spec[1] for spec in self.inputs + self.outputs if spec[0] == "list"}))
        referenced = {spec[1] for spec in self.inputs + self.outputs if spec[0] != "fixed"}
        # Type attributes no port refers to (StackV2's elem_type) are vertices of their own.
        self.portless_attrs = [(a.name, a.type == "list(type)") for a in op_def.attr
                               if a.type in ("type", "list(type)") and a.name not in referenced
                               and not a.name.startswith("_")]
        self.type_defaults = {a.name: a.default_value.type for a in op_def.attr
                              if a.type == "type" and a.HasField("default_value")}
        self._expanded: Dict[tuple, tuple] = {}

    @staticmethod
    def _arg_spec(arg):
        if arg.type_list_attr:
            return ("list", arg.type_list_attr, "")
        if arg.type_attr:
            return ("attr", arg.type_attr, arg.number_attr)
        return ("fixed", arg.type, arg.number_attr)

    def ports(self, attr) -> Tuple[Tuple[TypeAttr, ...], Tuple[TypeAttr, ...], Tuple[TypeAttr, ...]]:
        """``(input TypeAttrs, output TypeAttrs, all vertex TypeAttrs)`` for a node's attrs."""
        key = tuple(_count_value(attr, name) for name in self.count_attrs) if self.count_attrs else ()
        if self.portless_attrs:
            key += tuple(_count_value(attr, name) for name, _ in self.portless_attrs)
        cached = self._expanded.get(key)
        if cached is None:
            ins = _expand(self.inputs, attr)
            outs = _expand(self.outputs, attr)
            vertices = dict.fromkeys(ins + outs)
            for name, is_list in self.portless_attrs:
                if name not in attr:
                    continue
                if is_list:
                    for i in range(len(attr[name].list.type)):
                        vertices.setdefault((name, i))
                else:
                    vertices.setdefault((name, -1))
            cached = (ins, outs, tuple(vertices))
            self._expanded[key] = cached
        return cached


def _count_value(attr, name):
    """What decides the ports an attribute yields: its int, its list length, or presence."""
    if name not in attr:
        return None
    value = attr[name]
    kind = value.WhichOneof("value")
    return len(value.list.type) if kind == "list" else (value.i if kind == "i" else kind)


def _expand(specs, attr) -> Tuple[TypeAttr, ...]:
    ports: List[TypeAttr] = []
    for kind, name, number_attr in specs:
        if kind == "list":
            count = len(attr[name].list.type) if name in attr else 0
            ports.extend((name, i) for i in range(count))
            continue
        repeat = attr[number_attr].i if number_attr and number_attr in attr else 1
        ports.extend([(name, -1) if kind == "attr" else ("", name)] * repeat)
    return tuple(ports)


def parse_input(text: str) -> Tuple[str, int]:
    """``"x"`` -> ("x", 0), ``"x:2"`` -> ("x", 2), ``"^x"`` -> ("x", -1)."""
    if text.startswith("^"):
        return text[1:], -1
    colon = text.find(":")
    if colon < 0:
        return text, 0
    return text[:colon], int(text[colon + 1:])


class GraphView:
    """Nodes, edges and type-attribute vertices of one GraphDef (see module docstring).

    Per node ``i``: ``nodes[i]`` (the NodeDef), ``ops[i]``, ``op_defs[i]`` (None for
    unknown ops), ``inputs[i]`` (``(src, port)`` per data input), ``input_slots[i]``
    (index in ``node.input`` of each data input), ``consumers[i]`` (``(port, dst,
    dst_port)`` per outgoing data edge), ``in_attrs[i]`` / ``out_attrs[i]`` (TypeAttr per
    port) and ``vertices[i]`` (TypeAttr -> vertex id).
    Per vertex ``v``: ``vertex_node[v]``, ``vertex_attr[v]``, ``vertex_dtype[v]`` (the
    dtype before rewriting), ``fanin[v]``, ``fanout[v]``.
    """

    def __init__(self, graph_def, lookup_op_def: Callable[[str], Optional[object]],
                 function_ops: frozenset = frozenset()):
        self.graph_def = graph_def
        self.function_ops = function_ops  # op types that are calls of library functions
        self.nodes = list(graph_def.node)
        self.index: Dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.name in self.index:
                raise GraphRewriteError(
                    "duplicate node name %r (nodes %d and %d); node names must be unique"
                    % (node.name, self.index[node.name], i), node.name)
            self.index[node.name] = i
        self.ops = [node.op for node in self.nodes]
        self.op_defs: List[Optional[object]] = []
        self.inputs: List[List[Tuple[int, int]]] = []
        self.input_slots: List[List[int]] = []
        self.control_inputs: List[List[int]] = []
        self.consumers: List[List[Tuple[int, int, int]]] = [[] for _ in self.nodes]
        self.in_attrs: List[Tuple[TypeAttr, ...]] = []
        self.out_attrs: List[Tuple[TypeAttr, ...]] = []
        self.vertices: List[Dict[TypeAttr, int]] = []
        self.vertex_node: List[int] = []
        self.vertex_attr: List[TypeAttr] = []
        self.vertex_dtype: List[int] = []
        self._index_nodes(lookup_op_def)
        self.fanin: List[List[int]] = [[] for _ in self.vertex_node]
        self.fanout: List[List[int]] = [[] for _ in self.vertex_node]
        self._index_edges()
        self._check_acyclic()

    # -- construction -------------------------------------------------------------
    def _index_nodes(self, lookup_op_def) -> None:
        layouts: Dict[str, Optional[_OpLayout]] = {}
        index = self.index
        for i, node in enumerate(self.nodes):
            op = node.op
            if op not in layouts:
                op_def = lookup_op_def(op)
                layouts[op] = _OpLayout(op_def) if op_def is not None else None
            layout = layouts[op]
            data, slots, control = [], [], []
            for slot, text in enumerate(node.input):
                src = index.get(text)  # the common case: "name", output 0
                if src is not None:
                    data.append((src, 0))
                    slots.append(slot)
                    continue
                try:
                    name, port = parse_input(text)
                except ValueError:
                    raise GraphRewriteError("node %r has a malformed input %r" % (node.name, text),
                                            node.name) from None
                src = index.get(name)
                if src is None:
                    raise GraphRewriteError(
                        "node %r has input %r but the graph has no node %r (dangling input)"
                        % (node.name, text, name), node.name)
                if port < 0:
                    control.append(src)
                else:
                    data.append((src, port))
                    slots.append(slot)
            self.inputs.append(data)
            self.input_slots.append(slots)
            self.control_inputs.append(control)
            attr = node.attr
            if layout is None:
                self.op_defs.append(None)
                ins, outs, attrs = (UNKNOWN_ATTR,) * len(data), None, (UNKNOWN_ATTR,)
            else:
                self.op_defs.append(layout.op_def)
                ins, outs, attrs = layout.ports(attr)
                if len(ins) != len(data):
                    raise GraphRewriteError(
                        "node %r (%s) has %d data input(s) but its OpDef expects %d"
                        % (node.name, op, len(data), len(ins)), node.name)
            self.in_attrs.append(ins)
            self.out_attrs.append(outs)
            vertices = {}
            for type_attr in attrs:
                vertices[type_attr] = len(self.vertex_node)
                self.vertex_node.append(i)
                self.vertex_attr.append(type_attr)
                self.vertex_dtype.append(_dtype_of(attr, type_attr, layout))
            self.vertices.append(vertices)

    def _index_edges(self) -> None:
        fanin, fanout, vertices = self.fanin, self.fanout, self.vertices
        for i, data in enumerate(self.inputs):
            in_attrs = self.in_attrs[i]
            dst_vertices = vertices[i]
            for p, (j, q) in enumerate(data):
                src_attr = self.output_attr(j, q)
                s = vertices[j][src_attr]
                d = dst_vertices[in_attrs[p]]
                fanin[d].append(s)
                fanout[s].append(d)
                self.consumers[j].append((q, i, p))

    def output_attr(self, node: int, port: int) -> TypeAttr:
        """The TypeAttr of output ``port`` of ``node`` (validated)."""
        outs = self.out_attrs[node]
        if outs is None:  # unknown op: every port is its opaque vertex
            return UNKNOWN_ATTR
        if port >= len(outs):
            raise GraphRewriteError(
                "an input refers to %s:%d but %r (%s) has %d output(s)"
                % (self.nodes[node].name, port, self.nodes[node].name, self.ops[node], len(outs)),
                self.nodes[node].name)
        return outs[port]

    def _check_acyclic(self) -> None:
        """Raises unless every cycle passes through a NextIteration node (Kahn's algorithm)."""
        n = len(self.nodes)
        pending = [0] * n
        successors: List[List[int]] = [[] for _ in range(n)]
        for i in range(n):
            for src in [j for j, _ in self.inputs[i]] + self.control_inputs[i]:
                if self.ops[src] in _LOOP_BACK_EDGE_OPS:
                    continue
                pending[i] += 1
                successors[src].append(i)
        ready = [i for i in range(n) if pending[i] == 0]
        done = 0
        while ready:
            i = ready.pop()
            done += 1
            for k in successors[i]:
                pending[k] -= 1
                if pending[k] == 0:
                    ready.append(k)
        if done < n:
            stuck = next(i for i in range(n) if pending[i] > 0)
            name = self.nodes[stuck].name
            raise GraphRewriteError(
                "node %r is on a cycle that does not pass through a NextIteration node; "
                "only while-loop back edges may form cycles" % name, name)

    # -- queries ------------------------------------------------------------------
    def input_vertex(self, node: int, port: int) -> int:
        return self.vertices[node][self.in_attrs[node][port]]

    def output_vertex(self, node: int, port: int) -> int:
        return self.vertices[node][self.output_attr(node, port)]

    def regular_input_node(self, node: int, port: int = 0) -> Optional[int]:
        data = self.inputs[node]
        return data[port][0] if port < len(data) else None


def _dtype_of(attr, type_attr: TypeAttr, layout: Optional[_OpLayout]) -> int:
    name, index = type_attr
    if not name:
        return index
    if name not in attr:
        return layout.type_defaults.get(name, DT_INVALID) if layout else DT_INVALID
    value = attr[name]
    if index < 0:
        return value.type
    types = value.list.type
    return types[index] if index < len(types) else DT_INVALID


def topological_names(graph_def) -> List[str]:
    """Node names in an order where producers come before consumers (loop back edges aside)."""
    index = {node.name: i for i, node in enumerate(graph_def.node)}
    successors: List[List[int]] = [[] for _ in graph_def.node]
    pending = [0] * len(graph_def.node)
    for i, node in enumerate(graph_def.node):
        if node.op in ("NextIteration", "RefNextIteration"):
            continue
        for text in node.input:
            src = index.get(text.lstrip("^").split(":")[0])
            if src is not None and graph_def.node[src].op not in ("NextIteration", "RefNextIteration"):
                successors[src].append(i)
                pending[i] += 1
    ready = [i for i in range(len(pending)) if pending[i] == 0][::-1]
    order = []
    while ready:
        i = ready.pop()
        order.append(graph_def.node[i].name)
        for k in successors[i]:
            pending[k] -= 1
            if pending[k] == 0:
                ready.append(k)
    placed = set(order)
    return order + [node.name for node in graph_def.node if node.name not in placed]

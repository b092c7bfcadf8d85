"""Checking a graph's nodes against their OpDefs before anything rewrites it.

``check_nodes(graph_def, path, acknowledged=()) -> warnings`` raises ``ConversionError``
naming the first bad node and what is wrong with it; for every node whose op is registered
(or is a function of the graph's library)::

    attrs:   every attr without a default is present; every present attr fits its AttrDef
             (attr_check); attrs the OpDef does not define are warnings (TensorFlow ignores them)
    inputs:  well-formed names, no data input after a control input, as many data inputs as
             the OpDef gives for the node's number_attr / type_list_attr values
    edges:   the producer has that output, and its dtype is the one the consumer expects
    Const:   its dtype attr is its value tensor's dtype
    resource variables: ops reading or assigning a VarHandleOp's variable use its dtype

Function bodies of the library get the attr and input-count checks (an attr there may be a
placeholder of the function's own attrs).  An op type TensorFlow does not register stays a
float32 boundary (the rewrite reports it) -- unless it is one edit away from a registered op
type (``Conv2E``), almost surely a typo or a corrupted byte: that is an error naming the op it
resembles, unless the user listed it in ``acknowledged`` (``--op-types-to-exclude``: "this
op is mine, leave it").

``node_ports(node, op_def)`` gives the dtypes of a node's inputs and outputs without
materialising ``N`` copies for a huge ``N`` (a flipped bit in a count attr).
"""
from __future__ import annotations

import re
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..dtypes import dtype_name
from ..errors import ConversionError
from ..tf_compat import lookup_op_def, registered_op_names
from .attr_check import attr_problem, dtype_problem

_INPUT = re.compile(r"^\^?[A-Za-z0-9.][A-Za-z0-9_.\-/>]*(:[0-9]{1,9})?$")
_FUNCTION_INPUT = re.compile(r"^\^?[A-Za-z0-9_.\-/>]+(:[A-Za-z0-9_.\-/>]+(:[0-9]{1,9})?)?$")
_CONST_OPS = frozenset({"Const", "HostConst"})
_VARIABLE_HANDLES = frozenset({"VarHandleOp"})
_REF_OFFSET = 100
_FIX = "Re-export the graph or correct that node: TensorFlow refuses it too"


class Ports:
    """The dtypes of a node's inputs or outputs as ``(count, dtype)`` runs; None: unknown dtype."""

    def __init__(self, runs: Sequence[Tuple[int, Optional[int]]]):
        self.runs = list(runs)
        self.count = sum(count for count, _ in self.runs)

    def dtype(self, port: int) -> Optional[int]:
        for count, dtype in self.runs:
            if port < count:
                return dtype
            port -= count
        raise IndexError(port)


def node_ports(node, op_def) -> Tuple[Ports, Ports]:
    """``(inputs, outputs)`` of ``node`` under ``op_def`` (attr defaults apply); raises ValueError
    if an attr they need is missing or of the wrong kind (``check_nodes`` reports that first)."""
    defaults = {a.name: a.default_value for a in op_def.attr if a.HasField("default_value")}
    return _ports(node, op_def.input_arg, defaults), _ports(node, op_def.output_arg, defaults)


def _ports(node, args, defaults) -> Ports:
    runs = []
    for arg in args:
        if arg.type_list_attr:
            types = _attr(node, defaults, arg.type_list_attr, "list").list.type
            runs.extend((1, _ref(dtype, arg.is_ref)) for dtype in types)
            continue
        dtype = _attr(node, defaults, arg.type_attr, "type").type if arg.type_attr else arg.type
        count = _attr(node, defaults, arg.number_attr, "i").i if arg.number_attr else 1
        if count < 0:
            raise ValueError("has a negative count attr %r" % arg.number_attr)
        runs.append((count, _ref(dtype, arg.is_ref)))
    return Ports(runs)


def _attr(node, defaults, name: str, kind: str):
    value = node.attr[name] if name in node.attr else defaults.get(name)
    present = value.WhichOneof("value") if value is not None else "missing"
    if present != kind and not (kind == "list" and present is None):
        raise ValueError("lacks attr %r (a %s)" % (name, {"i": "int"}.get(kind, kind)))
    return value


def _ref(dtype: int, is_ref: bool) -> Optional[int]:
    if dtype_problem(dtype, ref_allowed=True):
        return None
    return dtype + _REF_OFFSET if is_ref and dtype < _REF_OFFSET else dtype


def compatible(expected: Optional[int], actual: Optional[int]) -> bool:
    """TensorFlow's ``TypesCompatible``: equal, or a reference feeding a value of its base type."""
    if expected is None or actual is None:
        return True
    return expected == actual or (expected < _REF_OFFSET and actual == expected + _REF_OFFSET)


def one_edit_apart(a: str, b: str) -> bool:
    """True if one insertion, deletion or substitution turns ``a`` into ``b`` (``a != b``)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    return a[i + 1:] == b[i + 1:] if len(a) == len(b) else a[i:] == b[i + 1:]


def check_nodes(graph_def, path: str, acknowledged: Iterable[str] = ()) -> List[str]:
    """Raises ConversionError for the first invalid node; returns warnings (see module docstring)."""
    functions = {f.signature.name: f.signature for f in graph_def.library.function}
    checker = _Checker(path, lambda op: lookup_op_def(op) or functions.get(op), frozenset(acknowledged))
    checker.check_graph(graph_def.node)
    for function in graph_def.library.function:
        checker.check_function(function)
    return checker.warnings


class _Checker:
    def __init__(self, path: str, lookup: Callable[[str], Optional[object]], acknowledged: frozenset):
        self.path = path
        self.lookup = lookup
        self.acknowledged = acknowledged
        self.warnings: List[str] = []
        self._registered: Optional[frozenset] = None

    def fail(self, where: str, node, problem: str):
        raise ConversionError("%s is not a valid graph: %snode %r (%s) %s" % (
            self.path, where, node.name, node.op[:60], problem), _FIX)

    # -- one node -------------------------------------------------------------------
    def check_node(self, node, where: str = "", in_function: bool = False):
        """Checks attrs and the input count; returns the node's (inputs, outputs) or None."""
        data = self._check_input_names(node, where, in_function)
        op_def = self.lookup(node.op)
        if op_def is None:
            self._unknown_op(node, where)
            return None
        defined = {attr_def.name: attr_def for attr_def in op_def.attr}
        for attr_def in op_def.attr:
            if attr_def.name not in node.attr and not attr_def.HasField("default_value"):
                self.fail(where, node, "lacks attr %r (%s), which %s requires" % (
                    attr_def.name, attr_def.type, node.op))
        for name in sorted(node.attr):
            attr_def = defined.get(name)
            if attr_def is None:
                if not name.startswith("_"):
                    self.warnings.append("%snode %r (%s) has attr %r, which this TensorFlow's %s does "
                                         "not define; it is ignored" % (where, node.name, node.op, name[:60],
                                                                        node.op))
                continue
            problem = attr_problem(node.attr[name], attr_def, in_function)
            if problem:
                self.fail(where, node, "attr %r %s" % (name, problem))
        if node.op in _CONST_OPS and "dtype" in node.attr and "value" in node.attr:
            held, declared = node.attr["value"].tensor.dtype, node.attr["dtype"].type
            if held != declared and not in_function:
                self.fail(where, node, "declares dtype %s but its value tensor is %s" % (
                    dtype_name(declared), dtype_name(held)))
        if in_function and any(value.WhichOneof("value") == "placeholder" for value in node.attr.values()):
            return None  # counts and dtypes depend on the function's instantiation
        try:
            inputs, outputs = node_ports(node, op_def)
        except ValueError as error:
            self.fail(where, node, str(error))
        if data != inputs.count:
            self.fail(where, node, "has %d data input(s) but %s takes %d here" % (
                data, node.op, inputs.count))
        return inputs, outputs

    def _check_input_names(self, node, where: str, in_function: bool) -> int:
        pattern = _FUNCTION_INPUT if in_function else _INPUT
        data, control_seen = 0, False
        for text in node.input:
            if not pattern.match(text):
                self.fail(where, node, "has a malformed input %r" % text[:80])
            if text.startswith("^"):
                control_seen = True
            elif control_seen:
                self.fail(where, node, "has data input %r after a control input" % text)
            else:
                data += 1
        return data

    def _unknown_op(self, node, where: str) -> None:
        if node.op in self.acknowledged:
            return
        if self._registered is None:
            self._registered = registered_op_names()
        close = sorted(name for name in self._registered if one_edit_apart(node.op, name))
        if close:
            resembles = " and ".join(repr(name) for name in close)
            raise ConversionError(
                "%s is not a valid graph: %snode %r has op %r, which TensorFlow does not register; it is one "
                "edit away from %s" % (self.path, where, node.name, node.op, resembles),
                "Correct the op name (a typo or a damaged file?); if %r is a custom op, pass "
                "--op-types-to-exclude %s to keep it as it is" % (node.op, node.op))

    # -- a graph and a function body ------------------------------------------------
    def check_graph(self, nodes) -> None:
        ports: Dict[str, Optional[Tuple[Ports, Ports]]] = {}
        for node in nodes:
            ports[node.name] = self.check_node(node)
        for node in nodes:
            mine = ports[node.name]
            port_index = 0
            for text in node.input:
                if text.startswith("^"):
                    continue
                source, _, number = text.partition(":")
                output = int(number) if number else 0
                theirs = ports.get(source)
                if theirs is not None:
                    produced = theirs[1]
                    if output >= produced.count:
                        self.fail("", node, "reads %r, but %r has %d output(s)" % (
                            text, source, produced.count))
                    if mine is not None:
                        expected, actual = mine[0].dtype(port_index), produced.dtype(output)
                        if not compatible(expected, actual):
                            self.fail("", node, "input %d (%r) is %s, but %s expects %s there" % (
                                port_index, text, dtype_name(actual), node.op, dtype_name(expected)))
                port_index += 1
        self._check_variable_dtypes(nodes)

    def _check_variable_dtypes(self, nodes) -> None:
        """An op with a ``dtype`` attr on a VarHandleOp's handle must use the variable's dtype
        (TensorFlow checks it only when the op runs: restoring a SavedModel fails)."""
        handles = {node.name: node for node in nodes if node.op in _VARIABLE_HANDLES and "dtype" in node.attr}
        for node in nodes:
            if not node.input or "dtype" not in node.attr or node.op in _VARIABLE_HANDLES:
                continue
            source, port = node.input[0].partition(":")[0], node.input[0].partition(":")[2]
            handle = handles.get(source)
            if handle is None or port not in ("", "0"):
                continue
            declared, used = handle.attr["dtype"].type, node.attr["dtype"].type
            if declared != used:
                self.fail("", node, "uses variable %r as %s, but the variable is %s" % (
                    source, dtype_name(used), dtype_name(declared)))

    def check_function(self, function) -> None:
        where = "function %r: " % function.signature.name
        for node in function.node_def:
            self.check_node(node, where, in_function=True)


def unknown_op_nodes(graph_def) -> List[str]:
    """Names of the nodes whose op neither TensorFlow nor the graph's library defines."""
    functions = {f.signature.name for f in graph_def.library.function}
    return [node.name for node in graph_def.node
            if node.op not in functions and lookup_op_def(node.op) is None]

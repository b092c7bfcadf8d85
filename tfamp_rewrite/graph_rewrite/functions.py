"""Function bodies as graphs, so the pass can rewrite them as Grappler's meta-optimizer does.

``body_as_graph(fdef, lookup)`` turns a FunctionDef into a GraphDef in which each input
argument is an ``_Arg`` node named after the argument and each output is a ``_Retval``
node; inputs use the GraphDef form ``node:port``.  ``graph_as_body(graph, body, fdef,
lookup)`` writes a rewritten graph back into a FunctionDef, converting ports back to the
FunctionDef form ``node:output_arg:index``.  ``reachable_functions`` lists the functions
the graph calls, directly, through function-valued attributes, or from other functions;
``input_pipeline_functions`` those of them only tf.data runs (a ``Dataset.map`` function).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set, Tuple

from tensorflow.core.framework import function_pb2, graph_pb2

LookupOpDef = Callable[[str], Optional[object]]


class UnsupportedFunction(Exception):
    """The function cannot be rewritten; the message says why (it is reported untouched)."""


@dataclass
class FunctionBody:
    """A FunctionDef as a GraphDef plus what is needed to write it back."""

    graph: graph_pb2.GraphDef
    arg_nodes: List[str]
    retval_nodes: Dict[str, str]  # output arg name -> _Retval node name


def _output_layout(node, lookup: LookupOpDef) -> List[Tuple[str, int]]:
    """``(output_arg_name, count)`` for each output arg of ``node``."""
    op_def = lookup(node.op)
    if op_def is None:
        raise UnsupportedFunction("it calls unknown op %r" % node.op)
    layout = []
    for arg in op_def.output_arg:
        if arg.type_list_attr:
            count = len(node.attr[arg.type_list_attr].list.type)
        elif arg.number_attr:
            count = node.attr[arg.number_attr].i
        else:
            count = 1
        layout.append((arg.name, count))
    return layout


def reachable_functions(graph_def) -> List[str]:
    """Names of library functions used by the graph, transitively, in discovery order."""
    library = {f.signature.name: f for f in graph_def.library.function}
    if not library:
        return []
    found: Dict[str, None] = {}
    pending = list(_called(graph_def.node, library))
    while pending:
        name = pending.pop(0)
        if name in found:
            continue
        found[name] = None
        pending.extend(_called(library[name].node_def, library))
    return list(found)


# tf.data's kernels (MapDataset, ParallelMapDatasetV2, GeneratorDataset, ReduceDataset, ...) and
# its iterators (OneShotIterator's dataset_factory) call the functions the input pipeline runs.
_INPUT_PIPELINE_OP = re.compile(r"Dataset|Iterator")
# TensorFlow 2 marks the functions tf.data traces; TensorFlow 1.15's carry no mark.
_TF_DATA_FUNCTION_ATTR = "_tf_data_function"


def input_pipeline_functions(graph_def) -> Set[str]:
    """Names of the library functions only the input pipeline calls: those tf.data ops take
    as attributes (or marked as tf.data's), and what they call, unless the graph's own
    computation also calls them.  Grappler's meta-optimizer leaves these to tf.data's own
    optimizer, and they run on the host, so the mixed-precision pass leaves them alone."""
    library = {f.signature.name: f for f in graph_def.library.function}
    if not library:
        return set()
    marked = [name for name, f in library.items()
              if _TF_DATA_FUNCTION_ATTR in f.attr and f.attr[_TF_DATA_FUNCTION_ATTR].b]
    pipeline = _closure(marked + _called(_pipeline_nodes(graph_def, library), library), library, True)
    computation = _closure(_called(_computation_nodes(graph_def.node), library), library, False,
                           pipeline_only=set(marked))
    return pipeline - computation


def _pipeline_nodes(graph_def, library):
    bodies = [graph_def.node] + [f.node_def for f in library.values()]
    return [node for nodes in bodies for node in nodes if _INPUT_PIPELINE_OP.search(node.op)]


def _computation_nodes(nodes):
    return [node for node in nodes if not _INPUT_PIPELINE_OP.search(node.op)]


def _closure(names, library, through_pipeline_ops, pipeline_only=frozenset()) -> Set[str]:
    """``names`` and the functions they call; without ``through_pipeline_ops``, not through
    tf.data ops nor into ``pipeline_only``."""
    found: Set[str] = set()
    pending = [name for name in names if name not in pipeline_only]
    while pending:
        name = pending.pop()
        if name in found or name in pipeline_only:
            continue
        found.add(name)
        nodes = library[name].node_def
        pending.extend(_called(nodes if through_pipeline_ops else _computation_nodes(nodes), library))
    return found


def _called(nodes, library) -> List[str]:
    names = []
    for node in nodes:
        if node.op in library:
            names.append(node.op)
        for value in node.attr.values():
            kind = value.WhichOneof("value")
            if kind == "func" and value.func.name in library:
                names.append(value.func.name)
            elif kind == "list":
                names.extend(f.name for f in value.list.func if f.name in library)
    return names


def body_as_graph(fdef, lookup: LookupOpDef) -> FunctionBody:
    """The FunctionDef ``fdef`` as a GraphDef (see module docstring)."""
    signature = fdef.signature
    for arg in list(signature.input_arg) + list(signature.output_arg):
        if arg.type_attr or arg.number_attr or arg.type_list_attr:
            raise UnsupportedFunction("it has type parameters (argument %r)" % arg.name)
    graph = graph_pb2.GraphDef()
    names: Set[str] = {node.name for node in fdef.node_def}
    arg_nodes = []
    for index, arg in enumerate(signature.input_arg):
        node = graph.node.add(name=arg.name, op="_Arg")
        node.attr["T"].type = arg.type
        node.attr["index"].i = index
        arg_nodes.append(arg.name)
        names.add(arg.name)
    layouts = {node.name: _output_layout(node, lookup) for node in fdef.node_def}
    for source in fdef.node_def:
        node = graph.node.add()
        node.CopyFrom(source)
        del node.input[:]
        node.input.extend(_to_graph_input(text, layouts) for text in source.input)
    retval_nodes = {}
    for index, arg in enumerate(signature.output_arg):
        name = _unique(arg.name + "_retval", names)
        node = graph.node.add(name=name, op="_Retval")
        node.input.append(_to_graph_input(fdef.ret[arg.name], layouts))
        node.attr["T"].type = arg.type
        node.attr["index"].i = index
        retval_nodes[arg.name] = name
    return FunctionBody(graph, arg_nodes, retval_nodes)


def graph_as_body(body: FunctionBody, fdef, lookup: LookupOpDef):
    """A copy of ``fdef`` whose nodes and rets are those of the rewritten ``body.graph``."""
    result = function_pb2.FunctionDef()
    result.CopyFrom(fdef)
    del result.node_def[:]
    result.ret.clear()
    args = set(body.arg_nodes)
    retvals = {name: arg for arg, name in body.retval_nodes.items()}
    layouts = {node.name: _output_layout(node, lookup) for node in body.graph.node
               if node.name not in args and node.name not in retvals}
    for node in body.graph.node:
        if node.name in args:
            continue
        if node.name in retvals:
            result.ret[retvals[node.name]] = _to_body_input(node.input[0], args, layouts)
            continue
        copy = result.node_def.add()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(_to_body_input(text, args, layouts) for text in node.input)
    return result


def _to_graph_input(text: str, layouts) -> str:
    """``node:out_arg:i`` -> ``node:port``; arguments and control inputs unchanged."""
    if text.startswith("^"):
        return text
    parts = text.split(":")
    if len(parts) == 1:
        return text  # an argument of the function
    if len(parts) != 3 or parts[0] not in layouts:
        raise UnsupportedFunction("it has an input %r this rewrite cannot resolve" % text)
    node, arg_name, index = parts[0], parts[1], int(parts[2])
    port = 0
    for name, count in layouts[node]:
        if name == arg_name:
            return node if port + index == 0 else "%s:%d" % (node, port + index)
        port += count
    raise UnsupportedFunction("input %r names no output of %r" % (text, node))


def _to_body_input(text: str, args: Set[str], layouts) -> str:
    """``node:port`` -> ``node:out_arg:i``; arguments and control inputs unchanged."""
    if text.startswith("^"):
        return text
    node, _, port_text = text.partition(":")
    port = int(port_text) if port_text else 0
    if node in args:
        return node
    for name, count in layouts[node]:
        if port < count:
            return "%s:%s:%d" % (node, name, port)
        port -= count
    raise UnsupportedFunction("%r refers to a missing output" % text)


def _unique(name: str, taken: Set[str]) -> str:
    candidate, suffix = name, 1
    while candidate in taken:
        candidate = "%s_%d" % (name, suffix)
        suffix += 1
    taken.add(candidate)
    return candidate

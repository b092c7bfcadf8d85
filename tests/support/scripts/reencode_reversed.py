"""``python reencode_reversed.py PATH...``: rewrites each saved graph's file with every NodeDef's attr
map in reverse key order -- the same message, other bytes, as protobuf runtimes whose map
order is not sorted write it.  Run with PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python, whose
maps keep insertion order (tests/saved_graph/test_deterministic_output.py)."""
import os
import sys

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2


def _reverse_attrs(graph_def) -> None:
    for node in graph_def.node:
        entries = [(key, node.attr[key]) for key in sorted(node.attr, reverse=True)]
        copies = []
        for key, value in entries:
            copy = type(value)()
            copy.CopyFrom(value)
            copies.append((key, copy))
        node.ClearField("attr")
        for key, value in copies:
            node.attr[key].CopyFrom(value)


def main(path: str) -> None:
    if os.path.isdir(path):
        path, message = os.path.join(path, "saved_model.pb"), saved_model_pb2.SavedModel()
    elif path.endswith(".meta"):
        message = meta_graph_pb2.MetaGraphDef()
    else:
        message = graph_pb2.GraphDef()
    with open(path, "rb") as handle:
        message.ParseFromString(handle.read())
    if isinstance(message, saved_model_pb2.SavedModel):
        graphs = [meta.graph_def for meta in message.meta_graphs]
    elif isinstance(message, meta_graph_pb2.MetaGraphDef):
        graphs = [message.graph_def]
    else:
        graphs = [message]
    before = message.SerializeToString(deterministic=True)
    for graph_def in graphs:
        _reverse_attrs(graph_def)
    assert message.SerializeToString(deterministic=True) == before  # the same message
    with open(path, "wb") as handle:
        handle.write(message.SerializeToString())


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        main(argument)

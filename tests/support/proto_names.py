"""Protocol buffer types of a TensorFlow, read from the serialized descriptors in its sources.

``ProtoSchema.load(directory)`` reads every ``*_pb2.py`` under ``directory`` (a TensorFlow
package: ``tensorflow_core`` of 1.15, ``tensorflow`` of 2.x). Generated modules embed
their ``.proto`` as a serialized FileDescriptorProto (protobuf 3.8's
``serialized_pb=_b('...')`` in TensorFlow 1.15, ``AddSerializedFile(b'...')`` in newer
ones); it is read from the source text, so the module is never imported.

``newer.added_since(older, roots)``: the names (fields, oneofs, enum values) that the
types reachable from ``roots`` have in ``newer`` and not in ``older``, each with its full
name -- what code using those types must not rely on when it runs on ``older``. Types
``older`` lacks altogether are reached only through such an added field, so their own
names are not listed, nor are names some type of ``older`` has (``NodeDef.device`` is
1.15's; ``SavedVariable.device`` is newer): code is matched by name, not by type.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterable, Optional, Set


class ProtoSchema:
    """Message and enum types by full name (``tensorflow.RewriterConfig``), and modules."""

    def __init__(self):
        self.names: Dict[str, Set[str]] = {}       # type -> its fields, oneofs or enum values
        self.references: Dict[str, Set[str]] = {}  # message -> the types of its fields, nested types
        self.modules: Dict[str, Set[str]] = {}     # "core.framework.graph_pb2" -> its top-level types

    @classmethod
    def load(cls, directory: Path) -> "ProtoSchema":
        from google.protobuf import descriptor_pb2

        schema = cls()
        directory = Path(directory)
        for path in sorted(directory.rglob("*_pb2.py")):
            serialized = _serialized_file(path)
            if serialized is None:
                continue
            proto = descriptor_pb2.FileDescriptorProto.FromString(serialized)
            module = ".".join(path.relative_to(directory).with_suffix("").parts)
            top = schema.modules.setdefault(module, set())
            prefix = proto.package + "." if proto.package else ""
            for message in proto.message_type:
                top.add(prefix + message.name)
                schema._add_message(message, prefix + message.name)
            for enum in proto.enum_type:
                top.add(prefix + enum.name)
                schema.names[prefix + enum.name] = {value.name for value in enum.value}
        return schema

    def _add_message(self, message, full: str) -> None:
        self.names[full] = {f.name for f in message.field} | {o.name for o in message.oneof_decl}
        self.references[full] = {f.type_name.lstrip(".") for f in message.field if f.type_name}
        for nested in message.nested_type:
            self.references[full].add(full + "." + nested.name)
            self._add_message(nested, full + "." + nested.name)
        for enum in message.enum_type:
            self.references[full].add(full + "." + enum.name)
            self.names[full + "." + enum.name] = {value.name for value in enum.value}

    def top_level(self, name: str) -> Set[str]:
        """Full names of the top-level types called ``name`` (``ConfigProto``)."""
        return {full for types in self.modules.values() for full in types
                if full.rsplit(".", 1)[-1] == name}

    def reachable(self, roots: Iterable[str]) -> Set[str]:
        seen: Set[str] = set()
        todo = [root for root in roots if root in self.names]
        while todo:
            full = todo.pop()
            if full not in seen:
                seen.add(full)
                todo.extend(t for t in self.references.get(full, ()) if t in self.names)
        return seen

    def added_since(self, older: "ProtoSchema", roots: Iterable[str]) -> Dict[str, str]:
        """``{name: full name}`` of what the types reachable from ``roots`` added since ``older``."""
        added: Dict[str, str] = {}
        known = set().union(*older.names.values())
        for full in sorted(self.reachable(roots) & set(older.names)):
            for name in sorted(self.names[full] - known):
                added.setdefault(name, "%s.%s" % (full, name))
        return added


def _serialized_file(path: Path) -> Optional[bytes]:
    tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr == "AddSerializedFile" and node.args:
            return _literal(node.args[0])
        for keyword in node.keywords:
            if keyword.arg == "serialized_pb":
                return _literal(keyword.value)
    return None


def _literal(node) -> Optional[bytes]:
    if isinstance(node, ast.Call) and node.args:  # _b('...') of protobuf 3.x for Python 2 and 3
        node = node.args[0]
    if isinstance(node, ast.Constant):
        value = node.value
        return value.encode("latin-1") if isinstance(value, str) else value
    return None

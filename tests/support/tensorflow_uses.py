"""Every TensorFlow name a Python source uses, found by reading it.

``tensorflow_uses(path) -> [Use]``: for ``import tensorflow as tf``, ``from
tensorflow.python.framework import kernels as _kernels`` and aliases made by assignment
(``tf1 = tf.compat.v1``) anywhere in the file, each dotted name rooted at such an alias
(``tf1.train.Optimizer``, as ``("tensorflow", "compat", "v1", "train", "Optimizer")``) and
each name imported from a ``tensorflow`` module. A call records its positional count and
keyword names, so a signature can be checked. Strings (``getattr(tf, "x", None)``) are
not names: such guarded look-ups are how code reaches names only one version has.

``attribute_names(path) -> {name: first line}``: every attribute name the file uses
(``.graph_options``) and every string passed to ``HasField`` / ``ClearField`` /
``WhichOneof``: where protocol buffer fields appear.
"""
from __future__ import annotations

import ast
import collections
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from python_api_tree import dotted_name

Use = collections.namedtuple("Use", "path line chain call")  # call: (positional, keywords) or None
_FIELD_METHODS = ("HasField", "ClearField", "WhichOneof")


def tensorflow_uses(path: Path) -> List[Use]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), str(path))
    aliases, uses = _aliases(tree, path)
    calls = {id(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        chain = _expand(dotted_name(node), aliases)
        if chain is None:
            continue
        call = calls.get(id(node))
        signature = None
        if call is not None and not any(isinstance(a, ast.Starred) for a in call.args) \
                and all(k.arg for k in call.keywords):
            signature = (len(call.args), tuple(k.arg for k in call.keywords))
        uses.append(Use(path, node.lineno, chain, signature))
    return uses


def attribute_names(path: Path) -> Dict[str, int]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), str(path))
    names: Dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.setdefault(node.attr, node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _FIELD_METHODS and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            names.setdefault(node.args[0].value, node.lineno)
    return names


def _aliases(tree, path) -> Tuple[Dict[str, Tuple[str, ...]], List[Use]]:
    """``{local name: TensorFlow dotted name}`` and the Uses of the imports themselves."""
    aliases: Dict[str, Tuple[str, ...]] = {}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tensorflow":
                    local = alias.asname or "tensorflow"
                    aliases[local] = tuple(alias.name.split(".")) if alias.asname else ("tensorflow",)
                    uses.append(Use(path, node.lineno, tuple(alias.name.split(".")), None))
        elif isinstance(node, ast.ImportFrom) and not node.level \
                and (node.module or "").split(".")[0] == "tensorflow":
            for alias in node.names:
                chain = tuple(node.module.split(".")) + (alias.name,)
                aliases[alias.asname or alias.name] = chain
                uses.append(Use(path, node.lineno, chain, None))
    changed = True
    while changed:  # assignments of aliased names, in any order
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id not in aliases:
                chain = _expand(dotted_name(node.value), aliases)
                if chain is not None:
                    aliases[node.targets[0].id] = chain
                    changed = True
    return aliases, uses


def _expand(dotted: Optional[Tuple[str, ...]], aliases) -> Optional[Tuple[str, ...]]:
    if not dotted or dotted[0] not in aliases:
        return None
    return aliases[dotted[0]] + dotted[1:]



"""Names a Python package defines, found by reading its sources (it is never imported).

``ApiTree(root, aliases)`` reads the packages under ``root``; ``aliases`` maps a top-level
name to the directory holding it (TensorFlow 1.15's ``tensorflow`` forwards to
``tensorflow_core``). ``resolve(("tensorflow", "compat", "v1", "train", "Optimizer",
"minimize"))`` walks the dotted name as Python would:

* in a module, a name is bound by ``def``, ``class``, an assignment or an import at
  module level (in ``if`` / ``try`` / ``with`` blocks too, not in functions), by a
  ``from M import *``, or is a submodule of a package; imported names are followed to
  where they are defined;
* in a class, a name is bound in its body or in a base class that can be resolved;
* past a function or any other value nothing more is known: the rest is accepted.

It returns a ``Resolved`` (the definitions found: function nodes, for signatures) or a
``Missing`` saying which part is not defined where.
"""
from __future__ import annotations

import ast
import collections
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

# One binding of a name: kind "module" (target: dotted module name), "import" (target:
# (module, name)), "def" / "class" (target: (node, module)), or "value".
Binding = collections.namedtuple("Binding", "kind target")
Resolved = collections.namedtuple("Resolved", "kind definitions")  # kind: module/def/class/value
Missing = collections.namedtuple("Missing", "index where")  # chain[index] is not defined in where

_BLOCKS = (ast.If, ast.Try, ast.With, ast.For, ast.While)


class ApiTree:
    """The modules under ``root`` (see the module docstring)."""

    def __init__(self, root: Path, aliases: Dict[str, str] = None):
        self.root = Path(root)
        self.aliases = dict(aliases or {})
        self._bindings: Dict[str, Dict[str, List[Binding]]] = {}

    # -- modules ---------------------------------------------------------------------
    def module_file(self, module: str) -> Optional[Path]:
        parts = module.split(".")
        parts[0] = self.aliases.get(parts[0], parts[0])
        base = self.root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def bindings(self, module: str) -> Dict[str, List[Binding]]:
        """``{name: [Binding, ...]}`` of ``module`` (empty when there is no such file)."""
        cached = self._bindings.get(module)
        if cached is None:
            cached = self._bindings[module] = {}  # set first: star imports may be cyclic
            path = self.module_file(module)
            if path is not None:
                is_package = path.name == "__init__.py"
                tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
                self._collect(tree.body, module, is_package, cached)
        return cached

    def _collect(self, body, module: str, is_package: bool, names) -> None:
        for statement in body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.setdefault(statement.name, []).append(Binding("def", (statement, module)))
            elif isinstance(statement, ast.ClassDef):
                names.setdefault(statement.name, []).append(Binding("class", (statement, module)))
            elif isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.asname:
                        names.setdefault(alias.asname, []).append(Binding("module", alias.name))
                    else:
                        top = alias.name.split(".")[0]
                        names.setdefault(top, []).append(Binding("module", top))
            elif isinstance(statement, ast.ImportFrom):
                source = _absolute(statement, module, is_package)
                for alias in statement.names:
                    if alias.name == "*":
                        for name, found in self.bindings(source).items():
                            if not name.startswith("_"):
                                names.setdefault(name, []).extend(found)
                    else:
                        names.setdefault(alias.asname or alias.name, []).append(
                            Binding("import", (source, alias.name)))
            elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                for target in targets:
                    for name in _assigned_names(target):
                        names.setdefault(name, []).append(Binding("value", None))
            elif isinstance(statement, _BLOCKS):
                for block in _blocks_of(statement):
                    self._collect(block, module, is_package, names)

    # -- dotted names ----------------------------------------------------------------
    def resolve(self, chain: Sequence[str]) -> Union[Resolved, Missing]:
        """Walks ``chain`` (a top-level module name, then attributes)."""
        if self.module_file(chain[0]) is None:
            return Missing(0, "the installed packages")
        current = Resolved("module", [chain[0]])
        for index in range(1, len(chain)):
            if chain[index].startswith("__") and chain[index].endswith("__"):
                return Resolved("value", [])  # what Python gives every module and class
            current = self._attribute(current, chain[index], chain[:index])
            if isinstance(current, Missing):
                return Missing(index, current.where)
            if current.kind in ("def", "value"):
                return current
        return current

    def _attribute(self, parent: Resolved, name: str, path) -> Union[Resolved, Missing]:
        if parent.kind == "module":
            return self._in_module(parent.definitions[0], name, set())
        found = []
        unknown_base = False
        for node, module in parent.definitions:  # classes
            result = self._in_class(node, module, name, set())
            if isinstance(result, Resolved):
                found.append(result)
            unknown_base = unknown_base or result is None
        if found:
            return found[0]
        if unknown_base:
            return Resolved("value", [])
        return Missing(0, "class %s" % ".".join(path))

    def _in_module(self, module: str, name: str, seen) -> Union[Resolved, Missing]:
        submodule = module + "." + name
        if (module, name) in seen:  # e.g. a package's ``from <itself> import <submodule>``
            if self.module_file(submodule) is not None:
                return Resolved("module", [submodule])
            return Resolved("value", [])
        seen.add((module, name))
        found = self.bindings(module).get(name)
        if not found:
            if self.module_file(submodule) is not None:
                return Resolved("module", [submodule])
            return Missing(0, "module %s" % module)
        results = [self._follow(binding, seen) for binding in found]
        resolved = [r for r in results if isinstance(r, Resolved)]
        if not resolved:
            return results[-1]
        kinds = [r.kind for r in resolved]
        for kind in ("module", "class", "def"):
            if kind in kinds:
                definitions = [d for r in resolved if r.kind == kind for d in r.definitions]
                return Resolved(kind, definitions)
        return Resolved("value", [])

    def _follow(self, binding: Binding, seen) -> Union[Resolved, Missing]:
        if binding.kind == "module":
            if self.module_file(binding.target) is None:
                return Resolved("value", [])  # a module outside the tree (sys, numpy, ...)
            return Resolved("module", [binding.target])
        if binding.kind == "import":
            source, name = binding.target
            if self.module_file(source) is None:
                return Resolved("value", [])
            return self._in_module(source, name, seen)
        if binding.kind in ("def", "class"):
            return Resolved(binding.kind, [binding.target])
        return Resolved("value", [])

    def _in_class(self, node, module: str, name: str, seen) -> Optional[Resolved]:
        """The binding of ``name`` in class ``node`` or its bases; None when a base is unknown."""
        if id(node) in seen:
            return Resolved("value", [])
        seen.add(id(node))
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
                return Resolved("def", [(statement, module)])
            if isinstance(statement, ast.ClassDef) and statement.name == name:
                return Resolved("class", [(statement, module)])
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                if any(name in _assigned_names(t) for t in targets):
                    return Resolved("value", [])
        unknown = False
        for base in node.bases:
            chain = dotted_name(base)
            if chain is None:
                unknown = True
                continue
            if chain == ("object",):
                continue
            base_class = self._in_module(module, chain[0], set())
            for part in chain[1:]:
                if isinstance(base_class, Resolved) and base_class.kind in ("module", "class"):
                    base_class = self._attribute(base_class, part, chain)
            if not (isinstance(base_class, Resolved) and base_class.kind == "class"):
                unknown = True
                continue
            for base_node, base_module in base_class.definitions:
                result = self._in_class(base_node, base_module, name, seen)
                if result is None:
                    unknown = True
                elif isinstance(result, Resolved):
                    return result
        return None if unknown else Missing(0, "")


def accepts_call(function: ast.FunctionDef, positional: int, keywords: Sequence[str]) -> Tuple[bool, str]:
    """Whether ``function`` accepts ``positional`` arguments and these keyword names."""
    arguments = function.args
    names = [a.arg for a in getattr(arguments, "posonlyargs", [])] + [a.arg for a in arguments.args]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    if arguments.vararg is None and positional > len(names):
        return False, "takes at most %d positional arguments, given %d" % (len(names), positional)
    if arguments.kwarg is None:
        allowed = set(names[positional:]) | {a.arg for a in arguments.kwonlyargs}
        unknown = [k for k in keywords if k not in allowed]
        if unknown:
            return False, "has no argument %s" % ", ".join(unknown)
    return True, ""


def _absolute(statement: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not statement.level:
        return statement.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (statement.level - 1)]
    return ".".join(base + ([statement.module] if statement.module else []))


def _assigned_names(target) -> List[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _assigned_names(element)]
    return []


def _blocks_of(statement):
    if isinstance(statement, ast.Try):
        return [statement.body, statement.orelse, statement.finalbody] + [h.body for h in statement.handlers]
    if isinstance(statement, ast.If):
        return [statement.body, statement.orelse]
    return [statement.body] + ([statement.orelse] if getattr(statement, "orelse", None) else [])


def dotted_name(node) -> Optional[Tuple[str, ...]]:
    """``('tf', 'compat', 'v1')`` for the expression ``tf.compat.v1``; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return tuple([node.id] + parts[::-1])
    return None

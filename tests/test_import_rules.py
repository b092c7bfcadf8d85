"""The package's folders are its architecture: each capability imports only what it may.

    basics (errors, dtypes, tf_compat)  <-  graph_rewrite  <-  doctor  <-  training, saved_graph
    basics                              <-  graph_rewrite  <-  training, saved_graph
    basics                              <-  fused_op       <-  training, saved_graph

The front doors at the top (``__init__``, ``__main__``, the ``run`` alias) may import
anything.  Imports are read from the source (``ast``), so an import inside a function or
under ``TYPE_CHECKING`` counts too.
"""
from __future__ import annotations

import ast
import os
import shutil
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
from repo_paths import REPO

PACKAGE = "tfamp_rewrite"
BASICS = "basics"
FRONT_DOOR = "front door"
# capability -> the capabilities it may import (itself included)
ALLOWED = {
    BASICS: {BASICS},
    "graph_rewrite": {BASICS, "graph_rewrite"},
    "doctor": {BASICS, "graph_rewrite", "doctor"},
    "fused_op": {BASICS, "fused_op"},
    "training": {BASICS, "graph_rewrite", "doctor", "fused_op", "training"},
    # fused_op: --validate runs emulated graphs in this process, rounding with its RoundToHalf op
    "saved_graph": {BASICS, "graph_rewrite", "doctor", "fused_op", "saved_graph"},
    FRONT_DOOR: {BASICS, "graph_rewrite", "doctor", "fused_op", "training", "saved_graph", FRONT_DOOR},
}
SHARED_BASICS = {"errors", "dtypes", "tf_compat", "user_log"}
FRONT_DOORS = {"__init__", "__main__", "run"}
# The package root's __init__ is a front door; of it, only its version string may be imported.
ROOT_NAMES_ANYONE_MAY_IMPORT = {"__version__"}


def capability_of(module: str) -> str:
    """``tfamp_rewrite.graph_rewrite.casts`` -> ``graph_rewrite``; basics and front doors by name."""
    parts = module.split(".")
    assert parts[0] == PACKAGE, module
    if len(parts) == 1:
        return FRONT_DOOR
    if parts[1] in SHARED_BASICS:
        return BASICS
    if parts[1] in FRONT_DOORS and len(parts) == 2:
        return FRONT_DOOR
    return parts[1]


def package_modules(root: str) -> Iterator[Tuple[str, str]]:
    """``(dotted module name, path)`` of every Python file of the package under ``root``."""
    top = os.path.join(root, PACKAGE)
    for directory, _, files in os.walk(top):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root)[:-3].split(os.sep)
                if relative[-1] == "__init__" and len(relative) > 2:
                    relative = relative[:-1]
                yield ".".join(relative), path


def imported_modules(module: str, path: str) -> Iterator[Tuple[int, str, List[str]]]:
    """``(line, absolute module, names)`` for every import of the package in ``path``."""
    is_package = path.endswith("__init__.py")
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module)
            if target.split(".")[0] != PACKAGE:
                continue
            names = [alias.name for alias in node.names]
            # ``from tfamp_rewrite.training import session`` imports the submodule.
            yield node.lineno, target, names


def _resolve(module: str, is_package: bool, level: int, name: Optional[str]) -> str:
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def violations(root: str) -> List[str]:
    """One line per import that goes against ``ALLOWED``."""
    found = []
    for module, path in package_modules(root):
        importer = capability_of(module)
        for line, target, names in imported_modules(module, path):
            for imported, exporter in _imported_capabilities(root, target, names):
                if exporter not in ALLOWED[importer]:
                    found.append("%s:%d: %s (%s) imports %s (%s); %s may import only %s" % (
                        os.path.relpath(path, root), line, module, importer, imported, exporter,
                        importer, ", ".join(sorted(ALLOWED[importer]))))
    return found


def _imported_capabilities(root: str, target: str, names: List[str]) -> Iterator[Tuple[str, str]]:
    """``(what is imported, its capability)``: a submodule where ``names`` are modules."""
    if target == PACKAGE and names and set(names) <= ROOT_NAMES_ANYONE_MAY_IMPORT:
        return
    for name in names or [""]:
        dotted = target + "." + name if name else target
        if name and _is_module(root, dotted):
            yield dotted, capability_of(dotted)
        elif target == PACKAGE:  # a public name of the root: through the front door
            yield dotted, FRONT_DOOR
        else:
            yield target, capability_of(target)


def _is_module(root: str, dotted: str) -> bool:
    path = os.path.join(root, *dotted.split("."))
    return os.path.isfile(path + ".py") or os.path.isdir(path)


def test_every_capability_imports_only_what_it_may():
    found = violations(REPO)
    assert not found, "imports against the layout rules:\n" + "\n".join(found)


def test_every_module_belongs_to_a_known_capability():
    modules: Dict[str, str] = {m: capability_of(m) for m, _ in package_modules(REPO)}
    unknown = sorted(m for m, c in modules.items() if c not in ALLOWED)
    assert not unknown, "modules outside the five capabilities and the basics: %s" % unknown
    assert {"graph_rewrite", "doctor", "training", "saved_graph", "fused_op", BASICS} <= set(modules.values())


UPWARD_IMPORTS = [
    ("graph_rewrite_imports_training", "graph_rewrite/casts.py",
     "from ..training import session\n", "graph_rewrite) imports tfamp_rewrite.training.session"),
    ("basics_import_graph_rewrite", "errors.py",
     "from .graph_rewrite.rewrite import rewrite_graph_def\n",
     "(basics) imports tfamp_rewrite.graph_rewrite"),
    ("saved_graph_imports_training", "saved_graph/cli.py",
     "    from tfamp_rewrite.training.devices import log_once\n", "imports tfamp_rewrite.training.devices"),
    ("fused_op_imports_graph_rewrite", "fused_op/op.py",
     "import tfamp_rewrite.graph_rewrite.report\n", "imports tfamp_rewrite.graph_rewrite.report"),
    ("doctor_imports_training", "doctor/report.py",
     "from ..training import activation\n", "(doctor) imports tfamp_rewrite.training.activation"),
    ("graph_rewrite_imports_doctor", "graph_rewrite/rewrite.py",
     "    from ..doctor.probes import plan_probes\n", "(graph_rewrite) imports tfamp_rewrite.doctor.probes"),
    ("graph_rewrite_imports_public_api", "graph_rewrite/painter.py",
     "from tfamp_rewrite import Session\n", "imports tfamp_rewrite.Session (front door)"),
]


@pytest.mark.parametrize("case, module, line, expected", UPWARD_IMPORTS,
                         ids=[case[0] for case in UPWARD_IMPORTS])
def test_an_upward_import_is_caught(tmp_path, case, module, line, expected):
    shutil.copytree(os.path.join(REPO, PACKAGE), str(tmp_path / PACKAGE))
    target = tmp_path / PACKAGE / module
    source = target.read_text()
    if line.startswith("    "):  # inside a function: where a lazy import would hide
        source += "\n\ndef _lazy():\n" + line
    else:
        source += "\n" + line
    target.write_text(source)
    found = violations(str(tmp_path))
    assert len(found) == 1 and expected in found[0], found


def import_cycles(root: str) -> List[List[str]]:
    """Groups of modules that import each other, directly or round a circle (lazy imports and
    ``TYPE_CHECKING`` ones count: a reader follows them all the same)."""
    modules = dict(package_modules(root))
    edges: Dict[str, set] = {module: set() for module in modules}
    for module, path in modules.items():
        for _, target, names in imported_modules(module, path):
            for name in names or [""]:
                dotted = target + "." + name if name else target
                edges[module].add(dotted if dotted in modules else target)
    order: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    cycles = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in edges[module]:
            if other not in modules:
                continue
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = []
            while True:
                other = stack.pop()
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(modules):
        if module not in order:
            visit(module)
    return cycles


def test_no_module_imports_round_a_circle():
    assert import_cycles(REPO) == []


def test_a_circle_is_caught(tmp_path):
    shutil.copytree(os.path.join(REPO, PACKAGE), str(tmp_path / PACKAGE))
    report = tmp_path / PACKAGE / "graph_rewrite" / "report.py"
    report.write_text(report.read_text() + "\n\ndef _lazy():\n    from .rewrite import rewrite_graph_def\n")
    (cycle,) = import_cycles(str(tmp_path))
    assert {"tfamp_rewrite.graph_rewrite.report", "tfamp_rewrite.graph_rewrite.rewrite"} <= set(cycle)

"""Graphviz DOT of a converted graph, coloured by the rewrite's decisions.

``graph_to_dot(graph_def, report, focus=None, radius=2) -> str`` draws every node of the
converted graph, or only those within ``radius`` edges of ``focus``:

* green: runs in half (converted, or a constant folded to half);
* yellow boxes: Casts the rewrite added;
* red: deny list; pink: float32 because of a deny op upstream;
* blue: graph inputs/outputs and other preserved nodes; white: everything else float32.

Edges carrying half tensors are drawn green.  ``write_dot(text, path)`` writes FILE
atomically and, when Graphviz's ``dot`` is installed, renders ``FILE`` as PNG beside it
(or into FILE itself when it ends in ``.png``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import deque
from typing import Dict, List, Optional, Set

from ..dtypes import HALF_DTYPES
from ..errors import ConversionError
from ..graph_rewrite.graph_view import parse_input
from ..graph_rewrite.report import RewriteReport
from .explain import reason_chain
from .writer import new_file_mode, write_file_atomically

_TYPE_ATTRS = ("T", "dtype", "DstT")
_COLOURS = {"half": "#b6d7a8", "cast": "#ffe599", "deny": "#ea9999", "blocked": "#f4cccc",
            "preserved": "#cfe2f3", "float32": "#ffffff"}
_BLOCKED_RULES = frozenset({"deny_path", "infer_blocked", "constant_out_of_range"})


def graph_to_dot(graph_def, report: RewriteReport, focus: Optional[str] = None, radius: int = 2) -> str:
    """The DOT text (see module docstring)."""
    nodes = {node.name: node for node in graph_def.node}
    if focus is not None:
        reason_chain(report, focus)  # raises a ConversionError naming close matches
        shown = _neighbourhood(graph_def, focus, radius)
    else:
        shown = set(nodes)
    decisions = {decision.name: decision for decision in report.decisions}
    casts = {cast.name for cast in report.casts}
    title = "neighbourhood of " + focus if focus else "converted graph"
    lines = ["digraph converted {", "  rankdir=TB;",
             '  node [style=filled, fontname="Helvetica", fontsize=10];',
             '  label="%s: green = %s, yellow = Cast added, red = deny, pink = blocked by deny, '
             'blue = preserved";' % (title, report.dtype)]
    for name in (node.name for node in graph_def.node if node.name in shown):
        node = nodes[name]
        kind = _kind(node, decisions.get(name), name in casts)
        decision = decisions.get(name)
        dtype = report.dtype if _is_half(node) else (decision.dtype if decision is not None else "")
        label = "%s\\n%s%s" % (_escape(name), _escape(node.op), " (%s)" % dtype if dtype else "")
        extra = ", shape=box" if kind == "cast" else ""
        extra += ", penwidth=3" if name == focus else ""
        lines.append('  "%s" [label="%s", fillcolor="%s"%s];' % (_escape(name), label, _COLOURS[kind], extra))
    for node in graph_def.node:
        if node.name not in shown:
            continue
        for text in node.input:
            source, port = parse_input(text)
            if source not in shown:
                continue
            style = "style=dashed" if port < 0 else (
                'color="#38761d", penwidth=2' if _is_half(nodes[source]) else "")
            lines.append('  "%s" -> "%s"%s;' % (_escape(source), _escape(node.name),
                                                 " [%s]" % style if style else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _kind(node, decision, is_cast: bool) -> str:
    if is_cast:
        return "cast"
    if _is_half(node):
        return "half"
    if decision is None:
        return "float32"
    if decision.rule == "deny_list" or (decision.category == "deny" and decision.rule != "not_eligible"):
        return "deny"
    if decision.rule in _BLOCKED_RULES:
        return "blocked"
    if decision.rule == "not_eligible":
        return "preserved"
    return "float32"


def _is_half(node) -> bool:
    return any(name in node.attr and node.attr[name].type in HALF_DTYPES for name in _TYPE_ATTRS)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _neighbourhood(graph_def, focus: str, radius: int) -> Set[str]:
    neighbours: Dict[str, List[str]] = {node.name: [] for node in graph_def.node}
    for node in graph_def.node:
        for text in node.input:
            source = parse_input(text)[0]
            if source in neighbours:
                neighbours[node.name].append(source)
                neighbours[source].append(node.name)
    seen = {focus: 0}
    queue = deque([focus])
    while queue:
        name = queue.popleft()
        if seen[name] >= radius:
            continue
        for other in neighbours.get(name, ()):
            if other not in seen:
                seen[other] = seen[name] + 1
                queue.append(other)
    return set(seen)


def side_paths(path: str) -> List[str]:
    """Every path ``write_dot(text, path)`` may write: the DOT file, and the PNG beside it."""
    if path.lower().endswith(".png"):
        return [path]
    return [path, os.path.splitext(path)[0] + ".png"]


def write_dot(text: str, path: str) -> List[str]:
    """Writes the DOT (and a PNG when ``dot`` is installed); returns the paths written."""
    wants_png = path.lower().endswith(".png")
    renderer = shutil.which("dot")
    if wants_png and renderer is None:
        raise ConversionError("--dot %s asks for a PNG but Graphviz's dot is not installed" % path,
                              "Install Graphviz (apt-get install graphviz) or pass a .dot file")
    written = []
    dot_path = path if not wants_png else None
    if dot_path is not None:
        write_file_atomically(dot_path, text.encode("utf-8"))
        written.append(dot_path)
    if renderer is not None:
        png_path = path if wants_png else os.path.splitext(path)[0] + ".png"
        _render(renderer, text, png_path)
        written.append(png_path)
    return written


def _render(renderer: str, text: str, png_path: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=".%s.tmp-" % os.path.basename(png_path),
                                         dir=os.path.dirname(os.path.abspath(png_path)))
    os.close(handle)
    try:
        subprocess.run([renderer, "-Tpng", "-o", temporary], input=text.encode("utf-8"),
                       check=True, capture_output=True, timeout=300)
        os.chmod(temporary, new_file_mode(directory=False))
        os.replace(temporary, png_path)
    except (subprocess.SubprocessError, OSError) as error:
        raise ConversionError("Graphviz could not render %s (%s)" % (png_path, error),
                              "Write a .dot file instead and render it yourself") from None
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)

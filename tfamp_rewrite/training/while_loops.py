"""TF1 while loops, for diagnoses that cannot look inside them.

A TF1 ``tf.while_loop`` (Enter, Merge, Switch, NextIteration, Exit) runs its body in a frame
whose tensors cannot be fetched from outside, so no probe measures them: the first tensor
seen holding a loop's inf/nan is the Exit that carries it out.  ``while_loops`` maps each
Exit to its loop's nodes, so a heal keeps the loop's converted nodes float32 instead of the
Exit, then the Switch, then the Merge.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

_ENTER_OPS = frozenset({"Enter", "RefEnter"})
_EXIT_OPS = frozenset({"Exit", "RefExit"})


def while_loops(user_def, readers: Optional[Dict[str, List[str]]] = None
                ) -> Dict[str, Tuple[str, List[str]]]:
    """``{Exit node: (frame name, the nodes of its loop, nested loops' included)}`` for each
    TF1 while loop of ``user_def`` (a GraphDef; ``readers``: node -> the nodes reading its
    outputs, made from it when not given): the nodes reached from the loop's Enter nodes
    before its Exits."""
    if readers is None:
        readers = {}
        for node in user_def.node:
            for text in node.input:
                if not text.startswith("^"):
                    readers.setdefault(text.split(":")[0], []).append(node.name)
    ops = {node.name: node.op for node in user_def.node}
    frames: Dict[str, List[str]] = {}
    for node in user_def.node:
        if node.op in _ENTER_OPS:
            frames.setdefault(node.attr["frame_name"].s.decode(), []).append(node.name)
    loops = {}
    for frame, enters in frames.items():
        members, exits, stack = [], [], [(name, 0) for name in enters]
        seen = set()
        while stack:
            name, depth = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            members.append(name)
            for reader in readers.get(name, ()):
                op = ops.get(reader)
                if op in _EXIT_OPS and depth == 0:
                    exits.append(reader)
                elif op is not None:
                    stack.append((reader, depth + (op in _ENTER_OPS) - (op in _EXIT_OPS)))
        loops.update((name, (frame, members)) for name in exits)
    return loops

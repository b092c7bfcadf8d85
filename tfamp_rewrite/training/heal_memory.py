"""What a session heals, remembered beyond it: in this process, and in a heal file.

Sessions made later in the process, on a graph holding a healed node as it was (its op and
its inputs' names and ops), keep it float32 from their first run (``healed_in_this_process``):
an Estimator opens a new session, on a new graph of the same names, for every evaluation
and every ``train()`` call, and without this each would skip and heal again.  Another model
that merely reuses a name ("MatMul") is not healed.  The same nodes imported under a scope
(``import_graph_def``'s "import/", ``loader.load(import_scope=...)``, a frozen graph
served beside the training) are healed too, where their inputs carry the same scope.  A
session whose steps then fail in float32 too (its weights diverged) takes its heals back
(``forget_healed``).

``TFAMP_REWRITE_HEAL_FILE=path``: every heal writes the nodes kept float32 and the heals
there (a heal file, doctor/heal_files.py), and a session started with it set keeps them
float32 from its first run (``read_heal_file``), in this process or another.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, List, Optional

from ..doctor.heal_files import heal_file_exists, kept_in

HEAL_FILE_ENV = "TFAMP_REWRITE_HEAL_FILE"

_healed_in_process: Dict[str, tuple] = {}  # node name -> _node_signature, healed so far
_healed_lock = threading.Lock()


# convert_variables_to_constants freezes a resource variable's read into an Identity
_READS_FROZEN = {"ReadVariableOp": "Identity"}


def _node_signature(graph, name: str) -> Optional[tuple]:
    """``name``'s op type and its inputs' names and op types in ``graph``; None if absent."""
    try:
        op = graph.get_operation_by_name(name)
    except KeyError:
        return None
    return op.type, tuple((t.op.name, _READS_FROZEN.get(t.op.type, t.op.type)) for t in op.inputs)


def healed_in_this_process(graph) -> List[str]:
    """The nodes earlier sessions of this process healed that ``graph`` holds as they were,
    or under a scope (module docstring)."""
    with _healed_lock:
        healed = dict(_healed_in_process)
    if not healed:
        return []
    found = [name for name, signature in healed.items() if _node_signature(graph, name) == signature]
    for op in graph.get_operations():
        slash = op.name.find("/")
        while slash != -1:
            scope, name = op.name[:slash + 1], op.name[slash + 1:]
            if name in healed and _node_signature(graph, op.name) == _scoped(healed[name], scope):
                found.append(op.name)
            slash = op.name.find("/", slash + 1)
    return found


def _scoped(signature: tuple, scope: str) -> tuple:
    """``signature`` of a node imported under ``scope``: its inputs are under it too."""
    op_type, inputs = signature
    return op_type, tuple((scope + name, input_type) for name, input_type in inputs)


def remember_healed(graph, nodes) -> None:
    """Records that a session healed ``nodes`` of ``graph``, for later sessions."""
    signatures = {name: _node_signature(graph, name) for name in nodes}
    with _healed_lock:
        _healed_in_process.update((n, s) for n, s in signatures.items() if s is not None)


def forget_healed(graph, nodes) -> None:
    """Takes back ``remember_healed(graph, nodes)``: a session whose steps failed in float32
    too (weights that diverged) healed them for nothing, and later sessions (the next trial
    of a sweep, with a sane learning rate) would start with them float32."""
    signatures = {name: _node_signature(graph, name) for name in nodes}
    with _healed_lock:
        for name, signature in signatures.items():
            if _healed_in_process.get(name) == signature:
                del _healed_in_process[name]


def read_heal_file(environ=None) -> List[str]:
    """The nodes a previous run kept float32 (``$TFAMP_REWRITE_HEAL_FILE``), or none."""
    environ = os.environ if environ is None else environ
    path = environ.get(HEAL_FILE_ENV, "").strip()
    if not path or not heal_file_exists(path):
        return []
    try:
        return kept_in(path)
    except ValueError as error:
        raise ValueError("%s=%s cannot be read as a heal file (%s); delete it or point the "
                         "variable elsewhere" % (HEAL_FILE_ENV, path, error)) from None

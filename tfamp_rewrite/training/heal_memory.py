"""What a session heals, remembered beyond it: in this process, and in a heal file.

Sessions made later in the process, on a graph holding a healed node as it was (its op and
its inputs' names and ops), keep it float32 from their first run (``healed_in_this_process``):
an Estimator opens a new session, on a new graph of the same names, for every evaluation
and every ``train()`` call, and without this each would skip and heal again.  Another model
that merely reuses a name ("MatMul") is not healed.  The same nodes imported under a scope
(``import_graph_def``'s "import/", ``loader.load(import_scope=...)``, a frozen graph
served beside the training) are healed too, where their inputs carry the same scope; and
the same layer of the same model built under another top scope (the PTB tutorial's
"Train/Model/..." and "Test/Model/...": the same op past the first scope, reading the same
variables).  A session whose steps then fail in float32 too (its weights diverged) takes
its heals back (``forget_healed``).

``TFAMP_REWRITE_HEAL_FILE=path``: every heal writes the nodes kept float32 and the heals
there (a heal file, doctor/heal_files.py), and a session started with it set keeps them
float32 from its first run (``read_heal_file``), in this process or another.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, List, Optional

from ..doctor.heal_files import heal_file_exists, kept_in
from .state_guard import variable_op
from .variable_check import VARIABLE_OPS

HEAL_FILE_ENV = "TFAMP_REWRITE_HEAL_FILE"

_healed_in_process: Dict[str, tuple] = {}  # node name -> _node_signature, healed so far
_layers_in_process: Dict[str, tuple] = {}  # node name -> _layer_signature, healed so far
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


def _layer_signature(graph, name: str) -> Optional[tuple]:
    """``(op type, the variables its inputs read)`` of a node past its first scope ("Train/"
    of "Train/Model/out/MatMul"), or None for a node reading no variable or in no scope two
    deep: what the same layer of the same model in another graph also has."""
    try:
        op = graph.get_operation_by_name(name)
    except KeyError:
        return None
    variables = set()
    for tensor in op.inputs:
        source = tensor.op.inputs[0] if tensor.op.type == "ReadVariableOp" else tensor
        variable = variable_op(source)
        if variable.type in VARIABLE_OPS:
            variables.add(variable.name)
    tail = name.partition("/")[2]
    return (tail, op.type, frozenset(variables)) if variables and "/" in tail else None


def same_layer_elsewhere(graph, name: str) -> List[str]:
    """For a node ``name`` that ``graph`` does not hold, the nodes that are the same layer of
    the same model under another top scope: the same name past the first scope, reading
    variables, none of them under that scope (a name scope, as the PTB tutorial's "Train/"
    and "Test/"; "generator/" and "discriminator/" scope their own variables)."""
    tail = name.partition("/")[2]
    if "/" not in tail:
        return []
    found = []
    for op in graph.get_operations():
        head, _, other_tail = op.name.partition("/")
        if other_tail != tail:
            continue
        signature = _layer_signature(graph, op.name)
        if signature is not None and not any(v.startswith(head + "/") for v in signature[2]):
            found.append(op.name)
    return found


def healed_in_this_process(graph) -> List[str]:
    """The nodes earlier sessions of this process healed that ``graph`` holds as they were,
    under a scope, or as the same layer of the same model under another top scope (module
    docstring)."""
    with _healed_lock:
        healed, layers = dict(_healed_in_process), set(_layers_in_process.values())
    if not healed:
        return []
    found = [name for name, signature in healed.items() if _node_signature(graph, name) == signature]
    if layers:
        tails = {tail for tail, _, _ in layers}
        found += [op.name for op in graph.get_operations() if op.name not in healed
                  and op.name.partition("/")[2] in tails and _layer_signature(graph, op.name) in layers]
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
    layers = {name: _layer_signature(graph, name) for name in nodes}
    with _healed_lock:
        _healed_in_process.update((n, s) for n, s in signatures.items() if s is not None)
        _layers_in_process.update((n, s) for n, s in layers.items() if s is not None)


def forget_healed(graph, nodes) -> None:
    """Takes back ``remember_healed(graph, nodes)``: a session whose steps failed in float32
    too (weights that diverged) healed them for nothing, and later sessions (the next trial
    of a sweep, with a sane learning rate) would start with them float32."""
    signatures = {name: _node_signature(graph, name) for name in nodes}
    with _healed_lock:
        for name, signature in signatures.items():
            if _healed_in_process.get(name) == signature:
                del _healed_in_process[name]
                _layers_in_process.pop(name, None)


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

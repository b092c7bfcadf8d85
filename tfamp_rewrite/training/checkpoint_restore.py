"""Restoring a checkpoint written without loss scaling into a loss-scaled program.

Mixed precision adds the loss scale's state (``loss_scale/current_loss_scale``,
``loss_scale/good_steps``) to GLOBAL_VARIABLES, so a ``tf.train.Saver`` built afterwards --
the program's own, ``MonitoredTrainingSession``'s, an Estimator's -- saves and restores it.
A checkpoint the same program wrote in float32 has no such keys, and TensorFlow's
``RestoreV2`` fails on the first missing one: switching mixed precision on for a run that
resumes from its float32 checkpoints would stop it at the restore.

``restore_feeds`` is a session's answer to that ``NotFoundError``.  Where the failed run
restores from a checkpoint whose only missing keys are loss-scale variables of the graph, it
returns feeds for every output of the run's ``RestoreV2`` ops: the checkpoint's own tensors
(sliced as the restore asks, for partitioned variables) and, for the missing keys, the
variables' initial values.  Run again with those feeds, TensorFlow prunes the ``RestoreV2``
ops and assigns exactly what the restore would have, so no op is added to any graph
(a finalized graph included).  The values pass through host memory once, as a restore's do.
Any other missing key, or a failure that is not a restore, gets None: the caller re-raises
TensorFlow's own error unchanged.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest

from .devices import log_once
from .op_walks import ancestors
from .step_signals import loss_scale_variables, step_signals

_tf1 = tf.compat.v1
_RESTORE_OP = "RestoreV2"


def restore_feeds(graph, fetches, evaluate: Callable) -> Optional[Dict]:
    """Feeds that let ``fetches`` restore a checkpoint lacking the loss scale, or None.

    Args:
      graph: the user's graph, which ``fetches`` name elements of.
      fetches: what the failed ``Session.run`` fetched (for a Saver, its restore op's name).
      evaluate: runs a list of tensors of ``graph`` with the failed run's feeds.

    Returns ``{tensor: value}`` for the outputs of every ``RestoreV2`` the fetches depend on,
    after logging once which keys were missing and where their values came from.
    """
    restores = _restore_ops(graph, fetches)
    initial_tensors = _loss_scale_initial_values(graph) if restores else {}
    if not initial_tensors:
        return None
    names = sorted(initial_tensors)
    values = evaluate([t for op in restores for t in op.inputs[:3]]
                      + [initial_tensors[name] for name in names])
    initial_values = dict(zip(names, values[3 * len(restores):]))
    plans = []  # (RestoreV2 op, its checkpoint reader, its (key, slice) pairs)
    for index, op in enumerate(restores):
        prefix, keys, slices = (values[3 * index], values[3 * index + 1], values[3 * index + 2])
        try:
            reader = _tf1.train.NewCheckpointReader(_text(prefix))
        except (tf.errors.OpError, ValueError):  # no readable checkpoint: TensorFlow's error stands
            return None
        plans.append((op, reader, [(_text(k), _text(s)) for k, s in zip(keys, slices)]))
    missing = {}  # restored tensor -> the loss-scale variable it is assigned to, for keys not there
    for op, reader, entries in plans:
        for position, (key, _) in enumerate(entries):
            if not reader.has_tensor(key):
                variable = _assigned_variable(op.outputs[position])
                if variable not in initial_values:
                    return None
                missing[op.outputs[position]] = (key, variable)
    if not missing:
        return None
    feeds = {}
    for op, reader, entries in plans:
        for tensor, (key, spec), dtype in zip(op.outputs, entries, op.get_attr("dtypes")):
            value = (initial_values[missing[tensor][1]] if tensor in missing
                     else _sliced(reader.get_tensor(key), spec))
            feeds[tensor] = np.asarray(value, dtype=dtype.as_numpy_dtype)
    restored = {key for _, _, entries in plans for key, _ in entries} - {key for key, _ in missing.values()}
    log_once(
        f"tfamp_rewrite: checkpoint {_text(values[0])!r} has no "
        f"{', '.join(key for key, _ in missing.values())}: it was written without mixed "
        f"precision's loss scaling. Restored the other {len(restored)} variable"
        f"{'' if len(restored) == 1 else 's'} from it; the "
        "loss scale starts from its initial state ("
        + ", ".join(f"{variable} = {initial_values[variable]}" for _, variable in missing.values())
        + "). A TensorFlow NOT_FOUND line logged for these keys came from the restore's first "
        "try, which this answered."
    )
    return feeds


def _assigned_variable(restored) -> Optional[str]:
    """The name of the variable op a restored tensor is assigned to (``Assign`` of a reference
    variable, ``AssignVariableOp`` of a resource one, through ``Identity`` ops), or None."""
    frontier = [restored]
    while frontier:
        tensor = frontier.pop()
        for consumer in tensor.consumers():
            if consumer.type.startswith("Assign") and consumer.inputs[1].name == tensor.name:
                return consumer.inputs[0].op.name
            if consumer.type == "Identity":
                frontier.extend(consumer.outputs)
    return None


def _restore_ops(graph, fetches) -> List:
    """The ``RestoreV2`` ops among the ancestors of ``fetches`` (inputs and control inputs)."""
    try:
        ops = [_as_operation(graph.as_graph_element(element)) for element in nest.flatten(fetches)]
    except (TypeError, ValueError, KeyError):
        return []
    return sorted((op for op in ancestors(ops) if op.type == _RESTORE_OP), key=lambda op: op.name)


def _as_operation(element):
    return element if isinstance(element, tf.Operation) else element.op


def _loss_scale_initial_values(graph) -> Dict[str, object]:
    """``{variable name: initial-value tensor}`` of the loss-scale state in ``graph``."""
    with graph.as_default():
        variables = loss_scale_variables(step_signals(graph))
    return {v.op.name: v.initial_value for v in variables}


def _sliced(value, spec: str):
    """``value`` cut to a ``shape_and_slices`` entry: ``""`` (all of it), or the full shape's
    dimensions, a space, then one ``start,length`` or ``-`` (all) per dimension, ``:``-joined."""
    if not spec:
        return value
    return value[tuple(_extent(text) for text in spec.split(" ")[-1].split(":"))]


def _extent(text: str) -> slice:
    if text == "-":
        return slice(None)
    start, length = (int(part) for part in text.split(","))
    return slice(start, start + length)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

"""Heals carried with checkpoints: what a training run keeps float32 reaches every process
that restores its checkpoints.

A rewriting session that keeps nodes float32 (it healed them, or carried them from a heal
file or an earlier session) and saves a checkpoint with a ``Saver`` writes
``HEALS_BESIDE_CHECKPOINTS`` into the checkpoint's directory (a heal file,
doctor/heal_files.py).  A rewriting session that restores a checkpoint from a directory
holding one keeps the nodes it lists float32 from then on, where its graph holds them: an
evaluation in another process, a notebook reloading the model, the next training run
resuming from its checkpoint.  The session says each once.

A Saver's runs are told by what they run, as the session never sees the Saver: a fed
string tensor that the save and restore ops read (the checkpoint's prefix), and a fetch
that a ``SaveV2`` (a save) or a ``RestoreV2`` (a restore) is behind, a few ops up.  Both
are looked up once per tensor and per fetch list.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from ..doctor.heal_files import (
    beside_checkpoint,
    heal_file_exists,
    heals_in,
    kept_in,
    kept_ops_in,
    write_heal_file,
)
from .devices import first_time, log_once
from .heal_memory import HEAL_FILE_ENV, same_layer_elsewhere
from .op_walks import ancestors
from .shadow_graph import has_operation

SAVE, RESTORE = "save", "restore"
SAVE_OPS = frozenset({"SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints"})
RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
# ops up from a Saver's fetch to its save or restore op: a sharded restore is
# restore_all <- restore_shard <- Assign(Variable) <- Identity <- RestoreV2
_FETCH_DEPTH = 5
_PREFIX_DEPTH = 3  # a prefix reaches a sharded save through StringJoin and ShardedFilename
_ESTIMATOR_TEMP_EXPORT = re.compile(r"^temp-(\d+)$")  # TF's export_lib.get_temp_export_dir


class CheckpointRuns:
    """Tells a session's Saver runs from its others (module docstring)."""

    def __init__(self):
        self._prefix_tensors: Dict[str, bool] = {}
        self._kinds: Dict[Tuple[str, ...], Optional[str]] = {}

    def checkpoint_run(self, elements, feeds) -> Optional[Tuple[str, str]]:
        """``(SAVE or RESTORE, checkpoint prefix)`` when a run of ``elements`` (tensors and
        operations) fed ``feeds`` (tensor -> value) is a Saver's save or restore, else None."""
        prefixes = [value for key, value in (feeds or {}).items()
                    if isinstance(key, tf.Tensor) and key.dtype == tf.string and self._is_prefix(key)]
        if not prefixes:
            return None
        names = tuple(element.name for element in elements)
        if names not in self._kinds:
            self._kinds[names] = _behind(elements)
        kind = self._kinds[names]
        prefix = _text(prefixes[0])
        return None if kind is None or prefix is None else (kind, prefix)

    def _is_prefix(self, tensor) -> bool:
        known = self._prefix_tensors.get(tensor.name)
        if known is None:
            known = self._prefix_tensors[tensor.name] = _reaches(tensor, SAVE_OPS | RESTORE_OPS)
        return known


# what a checkpoint a run resumes from holds beside the weights: global_step, an optimizer's slots
_RESUMED = re.compile(r"(^|/)global_step$|beta[12]_power|"
                      r"/(Adam|Momentum|RMSProp|Adagrad|Ftrl|Adadelta)(_\d+)?$")


def say_loss_scale_left_out(elements, loss_scale_variables: List[str]) -> None:
    """After a Saver's save run of ``elements``: says once when it wrote none of the loss
    scale's variables (names) but global_step or an optimizer's slots, as a Saver given
    ``tf.trainable_variables() + [global_step]`` does -- every process resuming from its
    checkpoints starts the scale again and skips steps anew.  A weights-only export is no
    checkpoint to resume from, and is not said."""
    if not loss_scale_variables:
        return
    saved = set()
    for op in ancestors(elements):
        saving = op.type in ("SaveV2", "Save", "SaveSlices") and len(op.inputs) > 1
        names = op.inputs[1].op if saving else None
        if names is not None and names.type == "Const":
            saved.update(_text(name) for name in np.ravel(tf.make_ndarray(names.get_attr("value"))))
    resumes = any(_RESUMED.search(name) for name in saved)  # not a weights-only export
    if saved and resumes and not saved & set(loss_scale_variables):
        log_once("tfamp_rewrite: a Saver saves none of the loss scale's variables (e.g. %r): its "
                 "var_list leaves them out, so a process resuming from its checkpoints starts the "
                 "scale again from its initial value and skips steps until it falls again. Add "
                 "opt.variables() (or the variables named 'loss_scale/...') to its var_list "
                 "to resume where the scale settled (said once)" % sorted(loss_scale_variables)[0])


def save_beside(prefix: str, kept_float32, heals: List[dict], ops: Optional[Dict[str, str]] = None) -> None:
    """After a save of checkpoint ``prefix`` by a session keeping ``kept_float32`` (nodes)
    float32 (``heals``: its own heals, as dicts; ``ops``: their op types): writes them beside
    it as that checkpoint's, said once; a session keeping none writes that only where a heal
    file is there already (another trial's, in a directory a sweep's trials share)."""
    path = beside_checkpoint(prefix)
    if not kept_float32 and not heal_file_exists(path):
        return
    try:
        write_heal_file(path, kept_float32, heals, checkpoint=os.path.basename(prefix), ops=ops)
    except OSError as error:
        log_once("tfamp_rewrite: cannot write %s beside the checkpoint (%s): a session restoring "
                 "it starts without the %d node(s) this one keeps float32; set %s=path in both "
                 "processes instead (said once)" % (path, error.strerror or error, len(kept_float32),
                                                    HEAL_FILE_ENV))
        return
    if not kept_float32:
        return
    exported = estimator_export_path(path)
    if exported is not None:  # said where it ends up, not where the export is written first
        log_once("tfamp_rewrite: %s, in the SavedModel an Estimator exports (written to %s, which "
                 "it then renames), lists the %d node(s) this session keeps float32; a session "
                 "loading that SavedModel keeps them float32 too (said once)"
                 % (exported, os.path.dirname(os.path.dirname(path)), len(kept_float32)))
        return
    log_once("tfamp_rewrite: %s, beside the checkpoint, lists the %d node(s) this session keeps "
             "float32; a session restoring this session's checkpoints from %s keeps them float32 "
             "too (an evaluation, the next training run) (said once)"
             % (path, len(kept_float32), os.path.dirname(path)))


def estimator_export_path(path: str) -> Optional[str]:
    """Where ``path`` (a file in a SavedModel's ``variables/``) ends up when the SavedModel is
    an Estimator's export, which writes it to ``<base>/temp-<timestamp>`` and then renames
    that ``<base>/<timestamp>``; None for any other path."""
    variables, name = os.path.split(path)
    export, folder = os.path.split(variables)
    base, temporary = os.path.split(export)
    match = _ESTIMATOR_TEMP_EXPORT.match(temporary)
    if folder != "variables" or match is None:
        return None
    return os.path.join(base, match.group(1), folder, name)


def heals_beside(prefix: str) -> List[dict]:
    """The heal records beside checkpoint ``prefix``: what its training run healed, and why,
    for a session resuming from it to write beside its own checkpoints with its own."""
    return heals_in(beside_checkpoint(prefix))


def kept_beside(prefix: str, graph, restore_ops=(), already=frozenset()) -> List[str]:
    """Before a restore of checkpoint ``prefix`` into a session on ``graph``: the nodes the
    heals beside it keep float32 that ``graph`` holds (none without such a file), as named
    there, under the scope the restoring Saver was imported in (``restore_ops``:
    ``loader.load(import_scope="served")`` runs ``served/save/restore_all``), or as the same
    layer under another top scope (``heal_memory.same_layer_elsewhere``); ``already``: the
    nodes the session keeps float32 already (the line is said where the file adds some)."""
    path = beside_checkpoint(prefix)
    if not heal_file_exists(path):
        return []
    try:
        listed = kept_in(path, checkpoint=os.path.basename(prefix))
    except ValueError as error:
        log_once("tfamp_rewrite: %s, beside the restored checkpoint, cannot be read as the nodes "
                 "its training run kept float32 (%s): this session starts without them; delete "
                 "the file, and the next save writes it again (said once)" % (path, error))
        return []
    scopes = [""] + sorted(_import_scopes(restore_ops))
    ops = kept_ops_in(path)
    present, other_ops = [], []
    for name in listed:
        held = [scope + name for scope in scopes if has_operation(graph, scope + name)]
        # the same name for another op (an evaluation graph building a rotation MatMul first,
        # so the healed BatchMatMul is 'MatMul_1' there): not the node that was healed
        other = [each for each in held if ops.get(name, graph.get_operation_by_name(each).type)
                 != graph.get_operation_by_name(each).type]
        other_ops += [(name, each) for each in other]
        held = [each for each in held if each not in other]
        present += held[:1] or same_layer_elsewhere(graph, name)
    if other_ops and first_time("heals of other ops " + path):
        listed_as, here = other_ops[0]
        log_once("tfamp_rewrite: %s, beside the restored checkpoint, keeps %r float32, a %s where "
                 "it was healed; in this graph %r is a %s, so it is left as it is (the graph was "
                 "built in another order: its nodes took other names) (said once)" % (
                     path, listed_as, ops[listed_as], here, graph.get_operation_by_name(here).type))
    # said once per file, by a session it changes (an Estimator's predict graph holds none,
    # its evaluation keeps them already: carried in the process, said so)
    if set(present) - set(already) and first_time("heals restored from " + path):
        log_once("tfamp_rewrite: restored a checkpoint whose training run kept %d node(s) float32 "
                 "(%s): this session keeps the %d of them its graph holds float32 too (said once)"
                 % (len(listed), path, len(present)))
    return present


def _import_scopes(restore_ops) -> set:
    """The scopes the Savers of ``restore_ops`` (``<scope>/<saver>/restore_all``) sit under."""
    names = [getattr(op, "name", str(op)) for op in restore_ops]
    return {name.rsplit("/", 2)[0] + "/" for name in names if name.count("/") >= 2}


def _reaches(tensor, op_types) -> bool:
    """Whether ``tensor`` is read by an op of ``op_types`` within ``_PREFIX_DEPTH`` ops."""
    frontier, seen = [tensor.op], set()
    for _ in range(_PREFIX_DEPTH):
        readers = []
        for op in frontier:
            for output in op.outputs:
                readers.extend(reader for reader in output.consumers() if reader.name not in seen)
        if any(reader.type in op_types for reader in readers):
            return True
        seen.update(reader.name for reader in readers)
        frontier = readers
    return False


def _behind(elements) -> Optional[str]:
    """SAVE or RESTORE: which of the two ops is behind ``elements`` within ``_FETCH_DEPTH``
    ops (inputs and control inputs), the nearer first; None if neither."""
    frontier = [element if isinstance(element, tf.Operation) else element.op for element in elements]
    seen = {op.name for op in frontier}
    for _ in range(_FETCH_DEPTH):
        above: List = []
        for op in frontier:
            for upstream in [t.op for t in op.inputs] + list(op.control_inputs):
                if upstream.name not in seen:
                    seen.add(upstream.name)
                    above.append(upstream)
        if any(op.type in SAVE_OPS for op in above):
            return SAVE
        if any(op.type in RESTORE_OPS for op in above):
            return RESTORE
        frontier = above
    return None


def _text(value) -> Optional[str]:
    """A fed prefix (str, bytes, or a 0-d array of either) as text; None if it is not one."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None

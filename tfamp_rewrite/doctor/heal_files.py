"""Heal files: the nodes a training run kept float32, where other processes find them.

A heal file is JSON, ``{"kept_float32": [node names], "heals": [one dict per heal]}``,
written as a new file renamed into place, so a reader never sees half of one.  Beside
checkpoints it also holds ``"checkpoints": [[checkpoint name, [node names]], ...]``, what
the session saving each checkpoint of the directory kept float32 (nothing, too): the
trials of a sweep saving into one directory each restore their own.  Training
sessions write it where ``TFAMP_REWRITE_HEAL_FILE`` points and, as ``HEALS_BESIDE_CHECKPOINTS``,
into the directory of each checkpoint they save (a SavedModel's ``variables/`` too);
sessions restoring such a checkpoint, and ``tfamp-rewrite convert`` of such a SavedModel
or MetaGraph, keep the listed nodes float32.  A path with a scheme (``gs://``, ``hdfs://``,
``s3://``: where Estimators keep their checkpoints) is read and written through
TensorFlow's file system layer, the way its Saver writes the checkpoint beside it.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Dict, Iterable, List, Optional

HEALS_BESIDE_CHECKPOINTS = "tfamp_rewrite_heals.json"
MOST_CHECKPOINTS = 64  # checkpoint entries a heal file keeps (a Saver keeps 5 by default)


def beside_checkpoint(prefix: str) -> str:
    """The heal file beside checkpoint ``prefix`` (``dir/model-100``, ``export/variables/variables``)."""
    return os.path.join(os.path.dirname(prefix) or ".", HEALS_BESIDE_CHECKPOINTS)


def heal_file_exists(path: str) -> bool:
    """Whether a file is at ``path`` (local, or on a file system TensorFlow reaches)."""
    if not _has_scheme(path):
        return os.path.exists(path)
    try:
        return _gfile().exists(path)
    except Exception:  # noqa: BLE001 -- TensorFlow's errors for an unreachable file system
        return False


def kept_in(path: str, checkpoint: Optional[str] = None) -> List[str]:
    """The nodes the heal file at ``path`` keeps float32 -- for ``checkpoint`` (a name in its
    directory), what the session saving it kept, where the file lists checkpoints (none for
    one it does not list: its session kept none) -- ValueError (saying why) if it cannot be
    read as one."""
    try:
        content = json.loads(_text_of(path))
        if checkpoint is not None and "checkpoints" in content:
            return [str(name) for name in dict(_checkpoint_entries(content)).get(checkpoint, [])]
        return [str(name) for name in content["kept_float32"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(str(error) or type(error).__name__) from None


def _checkpoint_entries(content) -> List[list]:
    """``[[checkpoint name, [node names]], ...]`` of a heal file's content, oldest first."""
    entries = content.get("checkpoints", []) if isinstance(content, dict) else []
    return [[str(entry[0]), list(entry[1])] for entry in entries
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)]


def heals_in(path: str) -> List[dict]:
    """The heal records (``Heal`` dicts: culprit, trajectory, ...) of the heal file at
    ``path``; none where it has none or cannot be read (``kept_in`` says why)."""
    try:
        heals = json.loads(_text_of(path)).get("heals", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [dict(h, max_abs=float("inf") if h.get("max_abs") is None else h["max_abs"])
            for h in heals if isinstance(h, dict)]


def _text_of(path: str) -> str:
    """The text of the file at ``path`` (local, or through TensorFlow's file systems)."""
    if _has_scheme(path):
        return _remote_call(lambda: _gfile().GFile(path, "r").read())
    with open(path) as handle:
        return handle.read()


def kept_ops_in(path: str) -> Dict[str, str]:
    """``{node: op type}`` of the nodes the heal file at ``path`` keeps float32, where it
    records them (none for a file written before it did, or unreadable)."""
    try:
        ops = json.loads(_text_of(path)).get("kept_ops", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(name): str(op) for name, op in ops.items()} if isinstance(ops, dict) else {}


def write_heal_file(path: str, kept_float32: Iterable[str], heals: List[dict],
                    checkpoint: Optional[str] = None, ops: Optional[Dict[str, str]] = None) -> None:
    """Writes ``{"kept_float32": [...], "heals": [...]}`` to ``path``: a new file in its
    directory, renamed into place; with ``checkpoint`` (a checkpoint's name in that
    directory), the file's entry for it too, beside the others' (``MOST_CHECKPOINTS``
    latest); with ``ops``, the kept nodes' op types (``kept_ops``), beside those it has.
    Raises OSError."""
    kept_float32 = sorted(kept_float32)
    # strict JSON: a culprit's largest |x| that was inf/nan is written as null
    heals = [dict(h, max_abs=h["max_abs"] if math.isfinite(h["max_abs"]) else None) for h in heals]
    content = {"kept_float32": kept_float32, "heals": heals}
    if checkpoint is not None:
        try:
            entries = _checkpoint_entries(json.loads(_text_of(path))) if heal_file_exists(path) else []
        except (OSError, ValueError):
            entries = []  # unreadable: written anew
        entries = [entry for entry in entries if entry[0] != checkpoint] + [[checkpoint, kept_float32]]
        content["checkpoints"] = entries[-MOST_CHECKPOINTS:]
    if ops is not None:
        earlier = kept_ops_in(path) if checkpoint is not None and heal_file_exists(path) else {}
        content["kept_ops"] = dict(earlier, **{name: ops[name] for name in kept_float32 if name in ops})
    text = json.dumps(content, indent=1, sort_keys=True) + "\n"
    if _has_scheme(path):
        _write_remote(path, text)
        return
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".tfamp-heals-", dir=directory)
    try:
        with os.fdopen(handle, "w") as output:
            output.write(text)
        os.replace(temporary, path)
    except OSError:
        os.unlink(temporary)
        raise


def _write_remote(path: str, text: str) -> None:
    """``write_heal_file``'s new-file-then-rename through TensorFlow's file system layer
    (on an object store the rename is a copy: readers still see the old file or the new)."""
    gfile = _gfile()
    temporary = "%s/.tfamp-heals-%d-%s" % (path.rsplit("/", 1)[0], os.getpid(), os.urandom(4).hex())

    def write():
        with gfile.GFile(temporary, "w") as output:
            output.write(text)
        gfile.rename(temporary, path, overwrite=True)

    try:
        _remote_call(write)
    except OSError:
        try:
            gfile.remove(temporary)
        except Exception:  # noqa: BLE001 -- never written, or the file system is gone
            pass
        raise


def _has_scheme(path: str) -> bool:
    return "://" in path


def _gfile():
    import tensorflow as tf  # only for a path with a scheme: local heal files need no TensorFlow

    return tf.io.gfile


def _remote_call(function):
    """``function()``, TensorFlow's file errors raised as OSError (as local files raise them)."""
    import tensorflow as tf

    try:
        return function()
    except tf.errors.OpError as error:
        raise OSError(error.message) from None

"""Heal files: the nodes a training run kept float32, where other processes find them.

A heal file is JSON, ``{"kept_float32": [node names], "heals": [one dict per heal]}``,
written as a new file renamed into place, so a reader never sees half of one.  Training
sessions write it where ``TFAMP_REWRITE_HEAL_FILE`` points and, as ``HEALS_BESIDE_CHECKPOINTS``,
into the directory of each checkpoint they save (a SavedModel's ``variables/`` too);
sessions restoring such a checkpoint, and ``tfamp-rewrite convert`` of such a SavedModel
or MetaGraph, keep the listed nodes float32.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Iterable, List

HEALS_BESIDE_CHECKPOINTS = "tfamp_rewrite_heals.json"


def beside_checkpoint(prefix: str) -> str:
    """The heal file beside checkpoint ``prefix`` (``dir/model-100``, ``export/variables/variables``)."""
    return os.path.join(os.path.dirname(prefix) or ".", HEALS_BESIDE_CHECKPOINTS)


def kept_in(path: str) -> List[str]:
    """The nodes the heal file at ``path`` keeps float32; ValueError (saying why) if it
    cannot be read as one."""
    try:
        with open(path) as handle:
            return [str(name) for name in json.load(handle)["kept_float32"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(str(error) or type(error).__name__) from None


def write_heal_file(path: str, kept_float32: Iterable[str], heals: List[dict]) -> None:
    """Writes ``{"kept_float32": [...], "heals": [...]}`` to ``path``: a new file in its
    directory, renamed into place.  Raises OSError."""
    # strict JSON: a culprit's largest |x| that was inf/nan is written as null
    heals = [dict(h, max_abs=h["max_abs"] if math.isfinite(h["max_abs"]) else None) for h in heals]
    data = {"kept_float32": sorted(kept_float32), "heals": heals}
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".tfamp-heals-", dir=directory)
    try:
        with os.fdopen(handle, "w") as output:
            output.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(temporary, path)
    except OSError:
        os.unlink(temporary)
        raise

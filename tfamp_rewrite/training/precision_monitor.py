"""The precision monitor: every N-th loss-scaled step, how the half tensors fare, in TensorBoard.

Opt-in: ``TFAMP_REWRITE_MONITOR=N`` (N >= 1; unset or 0: off).  On every N-th step a
rewriting session counts, it fetches the doctor's range probes the step computes anyway
(``StepDiagnosis.fetches``: a histogram of magnitudes per half tensor, as held) and writes
TensorBoard scalars into ``TFAMP_REWRITE_MONITOR_DIR`` (default ``./tfamp_monitor``)::

    tfamp/loss_scale                 the scale the step used
    tfamp/skipped_steps              skipped steps so far in this session
    tfamp/heals                      heals so far
    tfamp/flush_share/<layer>        share of a layer's non-zero half values below the
                                     smallest subnormal (lost to zero), its worst tensor
    tfamp/overflow_share/<layer>     share beyond the largest finite half value (inf/nan incl.)

for the ``WORST_LAYERS`` layers with the largest shares (a layer is a node's name scope, a
gradient counted with its forward layer).  The step is TensorFlow's ``global_step`` where the
graph has one, else the session's own count of loss-scaled steps.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..doctor.limits import HalfLimits
from ..doctor.probe_ops import NONFINITE_BIN, OVERFLOW_BIN, ZERO_BIN

MONITOR_ENV = "TFAMP_REWRITE_MONITOR"
MONITOR_DIR_ENV = "TFAMP_REWRITE_MONITOR_DIR"
DEFAULT_DIR = "tfamp_monitor"
WORST_LAYERS = 5
_GRADIENT_SCOPE = re.compile(r"^gradients(_\d+)?/")


def monitor_every(environ=None) -> int:
    """``$TFAMP_REWRITE_MONITOR`` as a step interval (0: off)."""
    environ = os.environ if environ is None else environ
    text = environ.get(MONITOR_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError("%s=%r is not a number of steps; use e.g. 100 (every 100th step), or 0 "
                         "for off" % (MONITOR_ENV, text))
    return int(text)


def layer_of(node: str) -> str:
    """``"conv1/Conv2D"`` -> ``"conv1"``; ``"gradients/conv1/Conv2D_grad/..."`` -> ``"conv1"``."""
    name = _GRADIENT_SCOPE.sub("", node)
    return name.split("/")[0] if "/" in name else name


def shares(counts, limits: HalfLimits) -> Tuple[float, float]:
    """``(flush share, overflow share)`` of one probe's histogram (probe_ops' bins)."""
    counts = np.asarray(counts, np.int64)
    nonzero = int(counts[:ZERO_BIN].sum())
    if nonzero == 0:
        return 0.0, 0.0
    # bin b holds 2**(b-127) <= |x| < 2**(b-126): below the smallest subnormal flushes
    flushed = int(counts[:limits.min_subnormal_log2 + 127].sum())
    overflowing = int(counts[OVERFLOW_BIN]) + int(counts[NONFINITE_BIN])
    return flushed / nonzero, min(1.0, overflowing / nonzero)


class PrecisionMonitor:
    """Writes the scalars of the module docstring (one per session)."""

    def __init__(self, every: int, logdir: str, limits: HalfLimits):
        self.every = every
        self.logdir = logdir
        self.limits = limits
        self.steps = 0
        self.skipped = 0
        self._writer = None

    def count(self, skipped: bool) -> bool:
        """Counts one loss-scaled step; True when the next probes are for this one."""
        self.steps += 1
        self.skipped += bool(skipped)
        return self.steps % self.every == 0

    def due_next(self) -> bool:
        """True when the next loss-scaled step is one to probe."""
        return (self.steps + 1) % self.every == 0

    def write(self, step: Optional[int], scale: float, heals: int, probes: List, counts) -> None:
        """Writes one sample: the step's scale and counts, the worst layers' shares."""
        import tensorflow as tf

        flush: Dict[str, float] = {}
        overflow: Dict[str, float] = {}
        for probe, row in zip(probes, counts):
            layer = layer_of(probe.node)
            lost, beyond = shares(row, self.limits)
            flush[layer] = max(flush.get(layer, 0.0), lost)
            overflow[layer] = max(overflow.get(layer, 0.0), beyond)
        values = [("tfamp/loss_scale", scale), ("tfamp/skipped_steps", self.skipped), ("tfamp/heals", heals)]
        values += [("tfamp/flush_share/" + layer, share) for layer, share in _worst(flush)]
        values += [("tfamp/overflow_share/" + layer, share) for layer, share in _worst(overflow)]
        summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value))
                                              for tag, value in values])
        if self._writer is None:
            with tf.Graph().as_default():  # FileWriter refuses to be made while eager
                self._writer = tf.compat.v1.summary.FileWriter(self.logdir)
        self._writer.add_summary(summary, self.steps if step is None else step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _worst(by_layer: Dict[str, float]) -> List[Tuple[str, float]]:
    ranked = sorted(by_layer.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:WORST_LAYERS]

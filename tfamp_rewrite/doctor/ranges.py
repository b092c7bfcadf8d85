"""Ranges of probed tensors over the steps and batches of a run: ``RangeAccumulator``.

Each run that computed probes hands ``record`` the stacked results of ``ProbeOps`` and
the loss scale the run used.  Gradients are recorded *unscaled* (their values divided
by the scale: their exponents shifted by ``log2(scale)``, exact for the powers of two
dynamic loss scaling uses), so every question "what if the scale were S?" is a shift
of one histogram.  ``ranges()`` returns one ``TensorRange`` per tensor.

Counts of values "below 2**k" (flush, subnormal) are exact: the histogram's bins are
powers of two.  "Overflow" (beyond the largest finite half value) is exact at the scale
the run used; at another scale it counts the values that reach the next power of two
(for float16: 2**16 = 65536, so values in [65504, 65536) are not counted).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from .limits import HalfLimits
from .probe_ops import OVERFLOW_BIN, ZERO_BIN
from .probes import GRADIENT_ROLES, HalfNode, Probe

EXP_LOW, EXP_HIGH = -160, 160     # unscaled exponents kept (clamped beyond)
_SUBNORMAL_FIELD = 0              # float32 subnormals: treated as 2**-127
_NONFINITE_FIELD = 255


@dataclass
class TensorRange:
    """What one half-bound tensor held over a run (magnitudes of gradients unscaled)."""

    tensor: str
    node: str
    op: str
    category: Optional[str]
    role: str
    half_nodes: List[HalfNode]
    runs: int = 0
    elements: int = 0
    zeros: int = 0
    nonfinite: int = 0
    max_abs: float = 0.0
    min_abs_nonzero: Optional[float] = None
    overflow: int = 0                      # beyond the largest finite half value, as run
    run_scale_log2: Optional[int] = 0      # the scale every run used (None: it changed)
    histogram: List[List[int]] = field(default_factory=list)  # [[e, count]]: 2**e <= |x| < 2**(e+1)

    @property
    def nonzero(self) -> int:
        return sum(count for _, count in self.histogram)

    def count_below(self, log2: int, scale_log2: int = 0) -> int:
        """Non-zero finite values below ``2**log2`` once multiplied by ``2**scale_log2``."""
        return sum(count for exponent, count in self.histogram if exponent + scale_log2 < log2)

    def count_overflowing(self, limits: HalfLimits, scale_log2: int = 0) -> int:
        """Values beyond ``limits.max_finite`` once multiplied by ``2**scale_log2`` (module docstring)."""
        if self.max_abs * 2.0 ** scale_log2 <= limits.max_finite:
            return 0
        if self.run_scale_log2 is not None and scale_log2 == self.run_scale_log2:
            return self.overflow
        edge = math.ceil(math.log2(limits.max_finite))
        return max(1, sum(count for exponent, count in self.histogram if exponent + scale_log2 >= edge))


@dataclass
class StepRecord:
    """One probed run: the loss scale it used, its largest unscaled gradient, its time."""

    scale: float
    gradient_max: Optional[float]
    seconds: Optional[float] = None


class _Tensor:
    def __init__(self, probe: Probe):
        self.probe = probe
        self.histogram = np.zeros(EXP_HIGH - EXP_LOW, np.int64)
        self.runs = self.elements = self.zeros = self.nonfinite = self.overflow = 0
        self.max_abs = 0.0
        self.min_abs = math.inf
        self.scales = set()


class RangeAccumulator:
    """Per-tensor ranges and per-step records of one run (see module docstring)."""

    def __init__(self, limits: HalfLimits):
        self.limits = limits
        self.steps: List[StepRecord] = []       # runs that computed gradients
        self.batches = 0                        # runs that computed forward values only
        self.plain_seconds: List[float] = []    # unprobed runs, timed for comparison
        self.inexact_scales = False             # a loss scale that is not a power of two
        self._tensors: Dict[str, _Tensor] = {}

    def record(self, probes: List[Probe], counts, extrema, scale: float = 1.0,
               seconds: Optional[float] = None) -> bool:
        """Adds one run's results (``ProbeOps.fetches``); returns whether it computed gradients."""
        counts, extrema = np.asarray(counts, np.int64), np.asarray(extrema, np.float64)
        scale = float(scale) if scale else 1.0
        shift = int(round(math.log2(scale)))
        self.inexact_scales = self.inexact_scales or 2.0 ** shift != scale
        gradient_max = None
        for probe, row, (largest, smallest) in zip(probes, counts, extrema):
            gradient = probe.role in GRADIENT_ROLES
            tensor = self._tensor(probe)
            used = shift if gradient else 0
            self._add(tensor, row, largest, smallest, used, 2.0 ** used if gradient else 1.0)
            if gradient and math.isfinite(largest) and row[:ZERO_BIN].sum():
                gradient_max = max(gradient_max or 0.0, largest / scale)
        if any(p.role in GRADIENT_ROLES for p in probes):
            self.steps.append(StepRecord(scale, gradient_max, seconds))
            return True
        self.batches += 1
        return False

    def _tensor(self, probe: Probe) -> _Tensor:
        tensor = self._tensors.get(probe.tensor)
        if tensor is None:
            tensor = self._tensors[probe.tensor] = _Tensor(probe)
        return tensor

    @staticmethod
    def _add(tensor: _Tensor, row, largest: float, smallest: float, shift: int, divisor: float) -> None:
        tensor.runs += 1
        tensor.scales.add(shift)
        tensor.zeros += int(row[ZERO_BIN])
        tensor.nonfinite += int(row[_NONFINITE_FIELD])
        tensor.overflow += int(row[OVERFLOW_BIN])
        tensor.elements += int(row[:ZERO_BIN + 1].sum())
        fields = np.arange(ZERO_BIN)
        finite = (fields != _NONFINITE_FIELD) & (row[:ZERO_BIN] > 0)
        exponents = np.where(fields == _SUBNORMAL_FIELD, -127, fields - 127)[finite] - shift
        np.add.at(tensor.histogram, np.clip(exponents, EXP_LOW, EXP_HIGH - 1) - EXP_LOW,
                  row[:ZERO_BIN][finite])
        if math.isfinite(largest):
            tensor.max_abs = max(tensor.max_abs, largest / divisor)
        if math.isfinite(smallest):
            tensor.min_abs = min(tensor.min_abs, smallest / divisor)

    def ranges(self) -> List[TensorRange]:
        """One TensorRange per probed tensor, in the order they were first recorded."""
        result = []
        for name, t in self._tensors.items():
            bins = np.nonzero(t.histogram)[0]
            result.append(TensorRange(
                tensor=name, node=t.probe.node, op=t.probe.op, category=t.probe.category, role=t.probe.role,
                half_nodes=list(t.probe.half_nodes), runs=t.runs, elements=t.elements, zeros=t.zeros,
                nonfinite=t.nonfinite, max_abs=t.max_abs,
                min_abs_nonzero=t.min_abs if math.isfinite(t.min_abs) else None, overflow=t.overflow,
                run_scale_log2=next(iter(t.scales)) if len(t.scales) == 1 else None,
                histogram=[[int(b) + EXP_LOW, int(t.histogram[b])] for b in bins]))
        return result

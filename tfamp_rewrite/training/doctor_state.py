"""One run of the precision doctor over a program: what it probes, and when it stops.

``DoctorRun(dtype, steps, plain_steps)`` is shared by every probing session of the
process (``doctor_session``).  The first ``steps`` runs that compute gradients are
probed; then ``plain_steps`` more such runs go unprobed and are timed (the cost of
probing is the ratio of the two medians); the next run raises ``StopDoctor`` into the
program, which ``doctor_run`` catches.  ``report()`` is the ``DoctorReport`` so far.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional

from ..doctor.limits import limits_for
from ..doctor.ranges import RangeAccumulator
from ..doctor.report import DoctorReport, build_report
from ..graph_rewrite.compat import session_compat


class StopDoctor(BaseException):
    """Raised into the program once the doctor has what it needs (a BaseException, so
    that the program's own ``except Exception`` does not swallow it)."""


class DoctorRun:
    """The probes' results and the step count of one doctor run (see module docstring)."""

    def __init__(self, dtype: str = "float16", steps: int = 20, plain_steps: int = 3,
                 target: str = "gpu", stop: bool = True, margin_log2: int = 3,
                 compat: Optional[str] = None):
        if steps < 1 or plain_steps < 0:
            raise ValueError("steps must be >= 1 and plain_steps >= 0; got %r and %r" % (steps, plain_steps))
        self.dtype = dtype
        self.target = target
        self.compat = session_compat(compat)  # the rewrite sessions would make
        self.steps = steps
        self.plain_steps = plain_steps
        self.stop = stop
        self.margin_log2 = margin_log2
        self.accumulator = RangeAccumulator(limits_for(dtype))
        self.skipped: Dict[str, int] = {}
        self.notes: List[str] = []
        self._lock = threading.Lock()

    @property
    def probing(self) -> bool:
        """True while runs that compute gradients are still to be probed."""
        return len(self.accumulator.steps) < self.steps

    @property
    def finished(self) -> bool:
        return not self.probing and len(self.accumulator.plain_seconds) >= self.plain_steps

    def check(self) -> None:
        """Raises StopDoctor when the run has everything (and stopping is asked for)."""
        if self.stop and self.finished:
            raise StopDoctor("the precision doctor probed %d step(s)" % len(self.accumulator.steps))

    def record(self, probes, counts, extrema, scale: float, seconds: float) -> None:
        with self._lock:
            self.accumulator.record(probes, counts, extrema, scale, seconds)

    def record_plain(self, seconds: float) -> None:
        with self._lock:
            self.accumulator.plain_seconds.append(seconds)

    def report(self, notes: Optional[List[str]] = None) -> DoctorReport:
        with self._lock:
            return build_report(self.accumulator, self.dtype, self.target, self.skipped,
                                margin_log2=self.margin_log2, notes=self.notes + list(notes or []))

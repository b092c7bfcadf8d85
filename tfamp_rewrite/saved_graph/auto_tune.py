"""``--auto-tune``: a small set of nodes to keep in float32 so that ``--validate`` passes.

``search(start, candidates, passes)`` looks, with ``passes(kept)`` as its only oracle
(a conversion excluding ``kept``, validated), for few nodes to add to ``start`` (the
range-based set of ``--calibration-data``, or empty); ``candidates`` are the nodes the
conversion still holds in half, in topological order::

    if passes(start): done
    if not passes(start + all candidates): give up (even float32 everywhere fails)
    hi = smallest h with passes(start + C[:h])       # bisection over topological prefixes
    lo = largest l with passes(start + C[l:hi])      # then over suffixes of that prefix
    W  = C[lo:hi]                                    # the culprits lie in this block
    for sizes n = |W|/2, |W|/4, ..., 1:              # drop sub-blocks W no longer needs
        drop each block of n nodes from W if passes(start + W without it)
    keep start + W

Every trial is recorded (how many nodes kept, passed, the largest error), and stops
when ``max_trials`` validations have run, keeping the smallest set seen to pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

AUTO_TUNE = "auto_tune"


@dataclass
class Trial:
    """One validation of the search."""

    what: str
    kept: int
    passed: bool
    max_abs_error: Optional[float]


@dataclass
class AutoTuneReport:
    """How the search went, and the nodes it kept float32 beyond its start."""

    rtol: float
    atol: float
    start: int                        # nodes kept before the search (range-based)
    candidates: int                   # nodes still in half that it searched over
    passed: bool = False
    trials: List[Trial] = field(default_factory=list)
    kept: List[object] = field(default_factory=list)   # calibration.KeptNode

    def summary_lines(self) -> List[str]:
        lines = ["Auto-tune (rtol=%g, atol=%g): %s after %d validation(s); %d node(s) kept float32 beyond "
                 "the %d range-based one(s), of %d in half" % (
                     self.rtol, self.atol, "passed" if self.passed else "FAILED", len(self.trials),
                     len(self.kept), self.start, self.candidates)]
        lines.extend("  kept %s (%s): %s" % (node.name, node.op, node.reason) for node in self.kept)
        return lines


class _Budget(Exception):
    pass


def search(start: Sequence[str], candidates: Sequence[str],
           passes: Callable[[List[str], str], Tuple[bool, Optional[float]]],
           max_trials: int = 64) -> Tuple[List[str], List[Trial], bool]:
    """``(nodes to keep beyond start, trials, passed)`` (module docstring).

    ``passes(kept, what)`` validates a conversion keeping ``kept`` in float32.
    """
    trials: List[Trial] = []
    start = list(start)

    def ok(extra: List[str], what: str) -> bool:
        if len(trials) >= max(max_trials, 0):
            raise _Budget()
        passed, error = passes(start + extra, what)
        trials.append(Trial(what, len(start) + len(extra), passed, error))
        return passed

    try:
        if ok([], "the range-based set" if start else "no node kept"):
            return [], trials, True
    except _Budget:
        return [], trials, False
    every = list(candidates)
    try:
        if not every or not ok(every, "every remaining node (%d)" % len(every)):
            return every, trials, False
    except _Budget:
        return every, trials, False
    best = every
    try:
        lo, hi = 0, len(every)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(every[:mid], "prefix %d/%d" % (mid, len(every))):
                hi = mid
                best = every[:hi]
            else:
                lo = mid
        lo, top = 0, hi
        while top - lo > 1:
            mid = (lo + top) // 2
            if ok(every[mid:hi], "block %d..%d" % (mid, hi)):
                lo = mid
                best = every[lo:hi]
            else:
                top = mid
        window = every[lo:hi]
        best = window
        size = len(window) // 2
        while size >= 1:
            index = 0
            while index < len(window):
                smaller = window[:index] + window[index + size:]
                if smaller and ok(smaller, "without %d node(s) of %d" % (size, len(window))):
                    window = best = smaller
                else:
                    index += size
            size //= 2
    except _Budget:
        pass
    return best, trials, True



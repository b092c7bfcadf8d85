"""The loss scale a run needs, read off its gradients' magnitudes: ``advise``.

All fractions are of the non-zero finite gradient values (exact zeros, e.g. behind a
ReLU, lose nothing in half) that the rewrite holds in half, unscaled::

    at scale S = 2**s:  overflow  = share of values with |g| * S beyond the largest finite half value
                        subnormal = share with |g| * S < 2**min_normal_log2   (precision lost)
                        flush     = share with |g| * S < 2**min_subnormal_log2 (lost: 0 or one bit)
    recommended = 2**floor(log2(largest finite) - log2(max |g| over the steps) - margin_log2),
                  clipped to [1, 2**max_scale_log2]   # the largest power of two with headroom
    vanishing        = gradient tensors whose every value lies more than float16's whole range
                       (2**40) below the largest gradient: no scale reaches them, and they are
                       0 to working precision (residual branches behind zero-initialised
                       batch-norm scales, at the start of training); counted apart, and the
                       fractions are of the others' values
    scaling needed   = flush at scale 1 > tolerance, or overflow at scale 1
    dynamic needed   = scaling needed, and the steps' largest gradients moved by more than
                       the margin (a scale fixed now would overflow, or waste range, later)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

from .limits import HalfLimits
from .probes import ACTIVATION_GRADIENT, GRADIENT_ROLES
from .ranges import StepRecord, TensorRange

DEFAULT_MARGIN_LOG2 = 3
DEFAULT_TOLERANCE = 0.01
MAX_SCALE_LOG2 = 24


@dataclass
class ScaleCheck:
    """What one loss scale does to the gradients (fractions of non-zero values)."""

    scale: float
    overflow: float
    subnormal: float
    flush: float


@dataclass
class LossScaleAdvice:
    """The recommended initial loss scale, and whether scaling (dynamic scaling) is needed."""

    recommended: float
    margin: float                      # headroom kept below the largest finite value
    max_gradient: float                # largest unscaled gradient magnitude seen
    current: Optional[float]           # the scale the run used last (None: not scaled)
    unscaled: ScaleCheck
    at_current: Optional[ScaleCheck]
    at_recommended: ScaleCheck
    activation_unscaled: Optional[ScaleCheck]   # the activation gradients alone
    step_spread_log2: float            # log2(max / min) of the steps' largest gradients
    vanishing_tensors: int             # gradient tensors out of reach of any scale (docstring)
    vanishing_values: int
    scaling_needed: bool
    dynamic_needed: bool
    verdict: str


def check_scale(ranges: List[TensorRange], limits: HalfLimits, scale_log2: int) -> ScaleCheck:
    """The overflow / subnormal / flush fractions of ``ranges`` at scale ``2**scale_log2``."""
    nonzero = sum(r.nonzero for r in ranges)
    if not nonzero:
        return ScaleCheck(2.0 ** scale_log2, 0.0, 0.0, 0.0)
    over = sum(r.count_overflowing(limits, scale_log2) for r in ranges)
    subnormal = sum(r.count_below(limits.min_normal_log2, scale_log2) for r in ranges)
    flush = sum(r.count_below(limits.min_subnormal_log2, scale_log2) for r in ranges)
    return ScaleCheck(2.0 ** scale_log2, over / nonzero, subnormal / nonzero, flush / nonzero)


def advise(ranges: List[TensorRange], steps: List[StepRecord], limits: HalfLimits,
           margin_log2: int = DEFAULT_MARGIN_LOG2, tolerance: float = DEFAULT_TOLERANCE,
           max_scale_log2: int = MAX_SCALE_LOG2) -> Optional[LossScaleAdvice]:
    """The advice for the gradient tensors of ``ranges`` (None when there are none)."""
    gradients = [r for r in ranges if r.role in GRADIENT_ROLES]
    if not gradients:
        return None
    largest = max(r.max_abs for r in gradients)
    if largest > 0 and math.isfinite(largest):
        best = math.floor(math.log2(limits.max_finite) - math.log2(largest) - margin_log2)
    else:
        best = max_scale_log2
    best = min(max(best, 0), max_scale_log2)
    reach = math.ceil(math.log2(limits.max_finite)) - limits.min_subnormal_log2
    vanishing = [r for r in gradients if largest > 0 and r.max_abs < largest * 2.0 ** -reach]
    gradients = [r for r in gradients if r not in vanishing]
    maxima = [s.gradient_max for s in steps if s.gradient_max]
    spread = math.log2(max(maxima) / min(maxima)) if maxima else 0.0
    scales = [s.scale for s in steps]
    current = scales[-1] if scales and any(s != 1.0 for s in scales) else None
    unscaled = check_scale(gradients, limits, 0)
    activations = [r for r in gradients if r.role == ACTIVATION_GRADIENT]
    advice = LossScaleAdvice(
        recommended=2.0 ** best, margin=2.0 ** margin_log2, max_gradient=largest, current=current,
        unscaled=unscaled,
        at_current=check_scale(gradients, limits, round(math.log2(current))) if current else None,
        at_recommended=check_scale(gradients, limits, best),
        activation_unscaled=check_scale(activations, limits, 0) if activations else None,
        step_spread_log2=spread, vanishing_tensors=len(vanishing),
        vanishing_values=sum(r.nonzero for r in vanishing),
        scaling_needed=unscaled.flush > tolerance or unscaled.overflow > 0,
        dynamic_needed=False, verdict="")
    advice.dynamic_needed = advice.scaling_needed and spread > margin_log2
    advice.verdict = _verdict(advice, limits, len(steps), tolerance)
    return advice


def _verdict(advice: LossScaleAdvice, limits: HalfLimits, steps: int, tolerance: float) -> str:
    scale = "%s" % _power(advice.recommended)
    if not advice.scaling_needed:
        return ("no loss scaling needed: unscaled, %.2g%% of the gradient values flush to zero in %s "
                "and none overflow" % (100 * advice.unscaled.flush, limits.dtype))
    if advice.unscaled.overflow > 0 and advice.recommended == 1.0:
        return ("gradients overflow %s even unscaled (largest %.3g): no loss scale helps; keep the ops "
                "producing them in float32" % (limits.dtype, advice.max_gradient))
    wide = advice.at_recommended.flush > tolerance
    tail = (" Even at %s, %.2g%% still flush: the gradients span more than %s holds; keep the ops "
            "producing the smallest ones in float32, or use bfloat16." % (
                scale, 100 * advice.at_recommended.flush, limits.dtype)) if wide else ""
    if advice.dynamic_needed:
        return ("use dynamic loss scaling, starting at %s: the largest gradient moved by 2^%.1f over %d "
                "step(s), more than the %gx margin, so a fixed scale chosen now may overflow later.%s" % (
                    scale, advice.step_spread_log2, steps, advice.margin, tail))
    return ("a fixed loss scale of %s suffices over the %d observed step(s) (their largest gradients moved "
            "by 2^%.1f, within the %gx margin); dynamic loss scaling starting at %s is the safe default "
            "for a long run.%s" % (scale, steps, advice.step_spread_log2, advice.margin, scale, tail))


def _power(value: float) -> str:
    exponent = math.log2(value)
    return "2^%d = %d" % (exponent, value) if exponent == int(exponent) else "%g" % value

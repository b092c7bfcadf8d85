"""The figure of the mixed-precision paper, for a run's gradients: ``gradient_histogram_png``.

Two panels share one axis, log2 of the magnitude: left, the activation gradients as the
run computed them (unscaled; zeros in their own bar at the left edge); right, the same
values multiplied by the recommended loss scale.  The half type's range is shaded: its
normal range darker, its subnormal range lighter; what falls left of it flushes to zero,
what falls right of it overflows (each panel's title gives those shares of the values
drawn).  Weight gradients are drawn as an outline.  Drawn with matplotlib's Agg backend
(no display needed); returns the PNG's bytes, so the caller can write them atomically.
"""
from __future__ import annotations

import io
import math
from typing import Dict, List

from .limits import limits_for
from .report import DoctorReport


def _shares(histogram: List[List[int]], total: int, shift: int) -> Dict[int, float]:
    return {exponent + shift: 100.0 * count / total for exponent, count in histogram}


def _fractions(histogram: List[List[int]], limits, shift: int):
    """(flush, subnormal, overflow) shares of the drawn non-zero values at scale 2**shift."""
    total = max(sum(count for _, count in histogram), 1)
    edge = math.ceil(math.log2(limits.max_finite))
    return tuple(sum(n for e, n in histogram if test(e + shift)) / total for test in (
        lambda e: e < limits.min_subnormal_log2, lambda e: e < limits.min_normal_log2, lambda e: e >= edge))


def gradient_histogram_png(report: DoctorReport, title: str = "") -> bytes:
    """The PNG (see module docstring); ValueError if the report has no gradients."""
    gradients, advice = report.gradients, report.loss_scale
    if gradients is None or advice is None:
        raise ValueError("the report has no gradients held in half to draw")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    limits = limits_for(report.dtype)
    shift = round(math.log2(advice.recommended))
    if gradients.activation_histogram or gradients.activation_zeros:
        activation, zeros = gradients.activation_histogram, gradients.activation_zeros
        label = "activation gradients"
    else:
        activation, zeros, label = gradients.weight_histogram, gradients.zeros, "weight gradients"
    total = max(sum(count for _, count in activation) + zeros, 1)
    weight_total = max(sum(count for _, count in gradients.weight_histogram), 1)
    figure, axes = pyplot.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    top = 2 ** 7 if limits.dtype == "float16" else 2 ** 128
    for panel, (axis, scale_log2, heading) in enumerate((
            (axes[0], 0, "unscaled"), (axes[1], shift, "loss scale 2^%d (recommended)" % shift))):
        shares = _shares(activation, total, scale_log2)
        low = min(min(shares, default=0), limits.min_subnormal_log2 - 6)
        high = max(max(shares, default=0), 17 if limits.dtype == "float16" else 130)
        axis.axvspan(limits.min_subnormal_log2, limits.min_normal_log2, color="tab:green", alpha=0.12,
                     label="%s subnormal" % limits.dtype)
        axis.axvspan(limits.min_normal_log2, 16 if limits.dtype == "float16" else 128, color="tab:green",
                     alpha=0.25, label="%s normal range" % limits.dtype)
        axis.bar(list(shares), list(shares.values()), width=1.0, align="edge", color="tab:blue",
                 label=label)
        weights = _shares(gradients.weight_histogram, weight_total, scale_log2)
        if weights and activation is not gradients.weight_histogram:
            axis.step(sorted(weights), [weights[e] for e in sorted(weights)], where="post",
                      color="tab:orange", label="weight gradients (share of theirs)")
        axis.bar([low - 3], [100.0 * zeros / total], width=2.0, color="tab:gray",
                 label="zeros (%.0f%%)" % (100.0 * zeros / total))
        axis.set_xlim(low - 5, min(high + 2, top))
        axis.set_xlabel("log2(|gradient|)")
        flush, subnormal, overflow = _fractions(activation, limits, scale_log2)
        axis.set_title("%s: of the non-zero %s\n%.1f%% flush to zero, %.1f%% subnormal, %.2f%% overflow" % (
            heading, label, 100 * flush, 100 * subnormal, 100 * overflow), fontsize=10)
        if panel == 0:
            axis.set_ylabel("share of values (%)")
            axis.legend(fontsize=8, loc="upper right")
    figure.suptitle(title or "Gradients held in %s over %d step(s), as the paper's histogram" % (
        report.dtype, report.steps))
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    pyplot.close(figure)
    return buffer.getvalue()

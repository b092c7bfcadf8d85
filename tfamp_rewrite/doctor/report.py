"""The doctor's report: data first (dataclasses -> JSON and back), sentences in ``summary()``.

``build_report(accumulator, ...)`` turns the ranges a run recorded into a ``DoctorReport``:
the tensors at risk in half with the fix for each (``fixes``), the gradients' magnitudes
(the histogram of activation and weight gradients, unscaled), the loss-scale advice
(``advice``), what probing cost per step, and every probed tensor's range.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import typing
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from .advice import DEFAULT_MARGIN_LOG2, DEFAULT_TOLERANCE, LossScaleAdvice, advise
from .fixes import DEFAULT_FLUSH_THRESHOLD, DEFAULT_OVERFLOW_THRESHOLD, OVERFLOW, Risk, find_risks
from .limits import HalfLimits, limits_for
from .probes import ACTIVATION_GRADIENT, GRADIENT_ROLES, WEIGHT_GRADIENT
from .ranges import RangeAccumulator, TensorRange


@dataclass
class GradientSummary:
    """The gradient tensors held in half, and their magnitudes (unscaled)."""

    tensors: int
    activation_tensors: int
    weight_tensors: int
    values: int
    zeros: int
    activation_zeros: int
    activation_histogram: List[List[int]]   # [[e, count]]: 2**e <= |g| < 2**(e+1), summed over steps
    weight_histogram: List[List[int]]


@dataclass
class Timing:
    """Median seconds of a probed run and of a plain one (same fetches, no probes)."""

    probed_step_seconds: Optional[float]
    plain_step_seconds: Optional[float]
    probed_steps: int
    plain_steps: int

    @property
    def overhead(self) -> Optional[float]:
        if not self.probed_step_seconds or not self.plain_step_seconds:
            return None
        return self.probed_step_seconds / self.plain_step_seconds


@dataclass
class DoctorReport:
    """Everything one doctor run measured and concluded (see module docstring)."""

    dtype: str
    target: str
    steps: int                         # runs that computed gradients
    batches: int                       # runs that computed forward values only
    tensors_probed: int
    skipped: Dict[str, int]            # half-bound tensors not probed, by reason
    scales: List[float]                # the loss scale of each step
    overflow: List[Risk]
    underflow: List[Risk]
    gradients: Optional[GradientSummary]
    loss_scale: Optional[LossScaleAdvice]
    timing: Optional[Timing]
    tensors: List[TensorRange]
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DoctorReport":
        """The report ``to_dict`` (or its JSON) describes."""
        return _from_dict(cls, data)

    @property
    def limits(self) -> HalfLimits:
        return limits_for(self.dtype)

    def summary(self, max_rows: int = 8) -> str:
        """The report as a person reads it once."""
        skipped = ", ".join("%d %s" % (n, why) for why, n in sorted(self.skipped.items()))
        lines = ["tfamp_rewrite precision doctor (%s, target %s): %d step(s), %d forward-only batch(es), "
                 "%d half tensor(s) probed%s" % (
                     self.dtype, self.target, self.steps, self.batches, self.tensors_probed,
                     "; not probed: " + skipped if skipped else "")]
        for title, risks, none in (
                ("Overflow in %s (beyond %.6g, values become inf):" % (self.dtype, self.limits.max_finite),
                 self.overflow, "  none"),
                ("Underflow in %s (most non-zero values below 2^%d flush to zero):" % (
                    self.dtype, self.limits.min_subnormal_log2), self.underflow, "  none")):
            lines.append(title)
            partial = [risk for risk in risks if not (risk.entire and risk.kind != OVERFLOW)]
            entire = [risk for risk in risks if risk not in partial]
            lines.extend(_risk_lines(partial[:max_rows], self.dtype) or ([] if entire else [none]))
            if len(partial) > max_rows:
                lines.append("  ... %d more in the JSON report" % (len(partial) - max_rows))
            if entire:
                names = ", ".join(risk.tensor for risk in entire[:3]) + (", ..." if len(entire) > 3 else "")
                lines.append("  %d tensor(s) hold only values below 2^%d, all 0 in %s -- harmless where "
                             "they are meant to be ~0 (zero-initialised scales, gradient-free biases), else "
                             "keep them float32 (the JSON report has each fix): %s" % (
                                 len(entire), self.limits.min_subnormal_log2, self.dtype, names))
        lines.extend(self._gradient_lines())
        if self.timing is not None and self.timing.probed_step_seconds:
            plain = self.timing.plain_step_seconds
            lines.append("Time: probed step %.1f ms%s" % (1e3 * self.timing.probed_step_seconds, (
                ", plain step %.1f ms (probing costs %.2fx a plain step)" % (
                    1e3 * plain, self.timing.overhead)
                if plain else "")))
        lines.extend("note: " + note for note in self.notes)
        return "\n".join(lines)

    def _gradient_lines(self) -> List[str]:
        g, advice = self.gradients, self.loss_scale
        if g is None or advice is None:
            return ["Gradients: none held in %s were computed (no backward pass probed)" % self.dtype]
        lines = ["Gradients held in %s: %d tensor(s) (%d activation, %d weight), %d value(s), "
                 "%.1f%% zeros" % (
            self.dtype, g.tensors, g.activation_tensors, g.weight_tensors, g.values,
            100.0 * g.zeros / max(g.values, 1))]
        rows = [("unscaled", advice.unscaled)]
        if advice.activation_unscaled is not None:
            rows.append(("unscaled, activation gradients", advice.activation_unscaled))
        if advice.at_current is not None:
            rows.append(("at scale %s (current)" % _scale(advice.current), advice.at_current))
        rows.append(("at scale %s (recommended)" % _scale(advice.recommended), advice.at_recommended))
        for label, check in rows:
            lines.append("  %-34s %6.2f%% flush to zero, %6.2f%% subnormal, %6.3f%% overflow" % (
                label + ":", 100 * check.flush, 100 * check.subnormal, 100 * check.overflow))
        if advice.vanishing_tensors:
            reach = math.ceil(math.log2(self.limits.max_finite)) - self.limits.min_subnormal_log2
            lines.append("  (%d gradient tensor(s), %d value(s), lie entirely more than 2^%d below the "
                         "largest gradient: beyond any scale's reach and 0 to working precision; not in the "
                         "shares above)" % (advice.vanishing_tensors, advice.vanishing_values, reach))
        lines.append("Loss scale: %s %g = 2^%d (largest gradient %.3g, kept %gx below "
                     "%.6g)" % ("recommended initial" if advice.scaling_needed else
                                "none needed; the largest safe one would be",
            advice.recommended, round(math.log2(advice.recommended)), advice.max_gradient, advice.margin,
            self.limits.max_finite))
        lines.append("  dynamic loss scaling needed: %s -- %s" % (
            "yes" if advice.dynamic_needed else "no", advice.verdict))
        return lines


def _scale(value: float) -> str:
    exponent = math.log2(value)
    return "2^%d" % exponent if exponent == int(exponent) else "%g" % value


def _risk_lines(risks: List[Risk], dtype: str) -> List[str]:
    lines = []
    for risk in risks:
        lines.append("  %s  %s (%s list, %s): %s" % (risk.tensor, risk.op, risk.category or "no",
                                                    risk.role.replace("_", " "), risk.sentence(dtype)))
        if risk.fix is not None:
            lines.append("    keep float32: %s" % ", ".join(
                "%s (%s)" % (n.name, n.op) for n in risk.half_nodes))
            lines.append("      %s" % risk.fix.env)
            lines.append("      or lists=%r; tfamp-rewrite convert: %s" % (risk.fix.lists, " ".join(
                "--nodes-to-exclude '%s'" % pattern for pattern in risk.fix.nodes_to_exclude)))
    return lines


def build_report(accumulator: RangeAccumulator, dtype: str, target: str, skipped: Dict[str, int],
                 margin_log2: int = DEFAULT_MARGIN_LOG2, tolerance: float = DEFAULT_TOLERANCE,
                 overflow_threshold: float = DEFAULT_OVERFLOW_THRESHOLD,
                 flush_threshold: float = DEFAULT_FLUSH_THRESHOLD,
                 notes: Optional[List[str]] = None) -> DoctorReport:
    """The report of what ``accumulator`` recorded (see module docstring)."""
    limits = limits_for(dtype)
    ranges = accumulator.ranges()
    advice = advise(ranges, accumulator.steps, limits, margin_log2, tolerance)
    recommended = round(math.log2(advice.recommended)) if advice is not None else 0
    risks = find_risks(ranges, limits, lambda r: recommended if r.role in GRADIENT_ROLES else 0,
                       overflow_threshold, flush_threshold)
    notes = list(notes or [])
    if accumulator.inexact_scales:
        notes.append("a loss scale that is not a power of two was used: gradient magnitudes are unscaled "
                     "to the nearest power of two")
    if not ranges:
        notes.append("no half tensor was computed by a probed run: did the program run a session step?")
    probed = [s.seconds for s in accumulator.steps if s.seconds is not None]
    timing = Timing(statistics.median(probed) if probed else None,
                    statistics.median(accumulator.plain_seconds) if accumulator.plain_seconds else None,
                    len(probed), len(accumulator.plain_seconds)) if probed else None
    return DoctorReport(
        dtype=dtype, target=target, steps=len(accumulator.steps), batches=accumulator.batches,
        tensors_probed=len(ranges), skipped=dict(skipped), scales=[s.scale for s in accumulator.steps],
        overflow=[r for r in risks if r.kind == OVERFLOW], underflow=[r for r in risks if r.kind != OVERFLOW],
        gradients=_gradient_summary(ranges), loss_scale=advice, timing=timing, tensors=ranges, notes=notes)


def _gradient_summary(ranges: List[TensorRange]) -> Optional[GradientSummary]:
    gradients = [r for r in ranges if r.role in GRADIENT_ROLES]
    if not gradients:
        return None
    return GradientSummary(
        tensors=len(gradients), activation_tensors=sum(r.role == ACTIVATION_GRADIENT for r in gradients),
        weight_tensors=sum(r.role == WEIGHT_GRADIENT for r in gradients),
        values=sum(r.elements for r in gradients), zeros=sum(r.zeros for r in gradients),
        activation_zeros=sum(r.zeros for r in gradients if r.role == ACTIVATION_GRADIENT),
        activation_histogram=merge_histograms(r for r in gradients if r.role == ACTIVATION_GRADIENT),
        weight_histogram=merge_histograms(r for r in gradients if r.role == WEIGHT_GRADIENT))


def merge_histograms(ranges) -> List[List[int]]:
    """The sum of the ranges' ``[[e, count]]`` histograms."""
    total: Dict[int, int] = {}
    for r in ranges:
        for exponent, count in r.histogram:
            total[exponent] = total.get(exponent, 0) + count
    return [[e, total[e]] for e in sorted(total)]


def _from_dict(cls, data):
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _value(hints[f.name], data.get(f.name)) for f in dataclasses.fields(cls)
                  if f.name in data})


def _value(hint, value):
    if value is None:
        return None
    args = [a for a in getattr(hint, "__args__", ()) if a is not type(None)]
    origin = getattr(hint, "__origin__", None)
    if origin is typing.Union:
        return _value(args[0], value)
    if origin in (list, List) and args and dataclasses.is_dataclass(args[0]):
        return [_value(args[0], item) for item in value]
    if dataclasses.is_dataclass(hint):
        return _from_dict(hint, value)
    return value


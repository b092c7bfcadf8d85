"""Conversions that measure: validating one, and choosing what stays float32 by data.

``ConversionChecker`` validates a Conversion as ``--validate`` does (emulated Tensor Core
numerics without a GPU: the same result on every CPU, each rounding one RoundToHalf node
where the op library loads, else a Cast pair), the original graph running once for all the
checks of one command.  ``tuned_conversion`` is ``convert`` plus::

    --calibration-data (or --auto-tune):  calibration.calibrate on its batches (auto-tune
        without calibration data: on the validation inputs); the kept nodes are excluded
    --auto-tune:  auto_tune.search over the nodes still in half but not on the allow list,
        then, if that cannot pass, over all of them (keeping a MatMul / Conv float32 costs
        Tensor Core time and takes the infer ops after it out of half too); each trial a
        conversion validated by the checker (untimed); the nodes it needs are excluded too

and records both reports in the ConversionReport (``calibration``, ``auto_tune``).
"""
from __future__ import annotations

from typing import Dict, Optional

from ..fused_op.round_to_half import round_to_half_available
from ..graph_rewrite.graph_view import topological_names
from ..graph_rewrite.rewrite import emulate_rewritten
from ..graph_rewrite.rounding import use_rounding_op
from . import conversion as conversions
from .auto_tune import AUTO_TUNE, AutoTuneReport, search
from .calibration import KeptNode, calibrate, calibration_batches
from .conversion import Conversion, ConvertOptions, Prepared
from .formats import SavedGraph
from .graph_io import GraphIO, update_signatures
from .validate import DEFAULT_TOLERANCE, ValidationReport, Validator, validation_numerics
from .writer import stage_output


class ConversionChecker:
    """Validates conversions of ``saved`` against it (see module docstring)."""

    def __init__(self, saved: SavedGraph, io: GraphIO, dtype: str, output: str, numerics: str = "auto",
                 rtol: Optional[float] = None, atol: Optional[float] = None, input_data: Optional[str] = None,
                 batch_size: int = 4, seed: int = 0):
        self.numerics, self.why = validation_numerics(numerics)
        default = DEFAULT_TOLERANCE[self.numerics, dtype]
        rtol = default if rtol is None else rtol
        atol = rtol if atol is None else atol
        self.output = output
        self.text = output.lower().endswith(".pbtxt")
        self.validator = Validator(saved, io, rtol, atol, input_data, batch_size, seed)

    @property
    def rtol(self) -> float:
        return self.validator.rtol

    @property
    def atol(self) -> float:
        return self.validator.atol

    def check(self, conversion: Conversion, converted_path: Optional[str] = None,
              timed_runs: Optional[int] = None) -> ValidationReport:
        """Validates ``conversion``: the file at ``converted_path`` when its half nodes run
        natively, else a copy (emulated, when the numerics are) staged beside OUTPUT."""
        staged = None
        rounding = ""
        if converted_path is None or self.numerics == "emulate":
            graph_def = conversion.graph_def
            if self.numerics == "emulate":
                graph_def, _ = emulate_rewritten(conversion.graph_def, conversion.report.rewrite)
                rounding = "; rounding by Cast pairs"
                if round_to_half_available():  # the staged copy runs in this process only
                    rounding = "; rounding by %d RoundToHalf op(s)" % use_rounding_op(graph_def).replaced
            staged = stage_output(conversion.saved, graph_def, self.output,
                                  lambda meta: update_signatures(meta, graph_def))
            converted_path = staged.temporary
        try:
            report = self.validator.check(converted_path, self.text, timed_runs, conversion.io)
        finally:
            if staged is not None:
                staged.discard()
        report.numerics, report.numerics_reason = self.numerics, self.why + rounding
        return report


def tuned_conversion(saved: SavedGraph, options: ConvertOptions, prepared: Optional[Prepared] = None,
                     checker: Optional[ConversionChecker] = None,
                     calibration_data: Optional[str] = None, auto_tune: bool = False,
                     overflow_threshold: float = 0.0, flush_threshold: float = 0.5,
                     max_trials: int = 64) -> Conversion:
    """``convert``, then calibration and auto-tuning as asked (module docstring)."""
    prepared = prepared or conversions.prepare(saved, options)
    conversion = conversions.convert(saved, options, prepared)
    if not calibration_data and not auto_tune:
        return conversion
    if calibration_data:
        batches, label = calibration_batches(calibration_data, prepared.io.inputs), calibration_data
    else:
        batches, label = [checker.validator.feeds], "the validation inputs, %s" % checker.validator.inputs
    kept, calibration = calibrate(saved, prepared.io, conversion.rewritten, conversion.report.rewrite,
                                  options.dtype, label, batches, overflow_threshold, flush_threshold,
                                  checker.validator.initial_values if checker is not None else None)
    if kept:
        conversion = conversions.convert(saved, options, prepared, kept)
    tuning = None
    if auto_tune:
        kept, tuning = _auto_tune(saved, options, prepared, checker, conversion, kept, max_trials)
        tuning.start = len(calibration.kept)
        conversion = conversions.convert(saved, options, prepared, kept)
    conversion.report.calibration = calibration
    conversion.report.auto_tune = tuning
    return conversion


def _auto_tune(saved, options, prepared, checker: ConversionChecker, conversion: Conversion,
               kept: Dict[str, KeptNode], max_trials: int):
    decisions = {d.name: d for d in conversion.report.rewrite.decisions}
    candidates = [name for name in topological_names(saved.graph_def)
                  if name in decisions and decisions[name].converted and name not in kept]

    def passes(names, what):
        trial_kept = {name: kept.get(name) or KeptNode(name, decisions[name].op, AUTO_TUNE, what)
                      for name in names}
        report = checker.check(conversions.convert(saved, options, prepared, trial_kept), timed_runs=0)
        errors = [out.max_abs_error for out in report.outputs if out.max_abs_error is not None]
        return report.passed, max(errors) if errors else None

    # Ops around the MatMuls / Convs first: keeping those float32 costs little Tensor Core
    # time, and excluding an allow op also takes the infer ops that follow it out of half.
    cheap = [name for name in candidates if decisions[name].category != "allow"]
    extra, trials, passed = search(list(kept), cheap, passes, max_trials)
    if not passed and len(cheap) < len(candidates):
        more, more_trials, passed = search(list(kept), candidates, passes, max_trials - len(trials))
        extra, trials = more, trials + more_trials
    result = dict(kept)
    for name in extra:
        result[name] = KeptNode(name, decisions[name].op, AUTO_TUNE,
                                "the outputs differ beyond rtol=%g, atol=%g when it runs in %s "
                                "(bisection over %d half node(s) in topological order)" % (
                                    checker.rtol, checker.atol, options.dtype, len(candidates)))
    report = AutoTuneReport(rtol=checker.rtol, atol=checker.atol, start=len(kept), candidates=len(candidates),
                            passed=passed, trials=trials, kept=[result[name] for name in extra])
    return result, report

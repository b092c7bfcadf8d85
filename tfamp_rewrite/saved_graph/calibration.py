"""``--calibration-data``: keep in float32 every node whose observed range would not fit half.

The original graph runs in float32 on the calibration inputs, with the precision
doctor's probes on every tensor the conversion would hold in half (``doctor.probes``,
``doctor.probe_ops``)::

    batches = calibration arrays, split along their first axis when the input's first
              dimension is fixed and the array holds several of it (else one batch)
    ranges  = each half-bound tensor's magnitudes over the batches
    at risk = share of values beyond the largest finite half value > overflow threshold
              (default 0: any), or share of non-zero values below the smallest subnormal
              > flush threshold (default 0.5: most of them)
    kept    = every converted node holding an at-risk tensor in half: its producer and
              its converted readers (doctor.fixes.keep_float32)

The conversion then runs again with those nodes excluded; each is reported with the
tensor and the numbers that kept it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..doctor.fixes import DEFAULT_FLUSH_THRESHOLD, DEFAULT_OVERFLOW_THRESHOLD, Risk, find_risks, keep_float32
from ..doctor.limits import limits_for
from ..doctor.probe_ops import ProbeOps
from ..doctor.probes import plan_probes
from ..doctor.ranges import RangeAccumulator, TensorRange
from ..errors import ConversionError
from .formats import SavedGraph
from .graph_io import GraphIO, GraphTensor
from .validate import input_feed, load_input_data, loaded_graph, op_error_text

CALIBRATION = "calibration"


@dataclass
class KeptNode:
    """A node kept in float32 by calibration or auto-tuning, and why."""

    name: str
    op: str
    rule: str          # "calibration" or "auto_tune"
    reason: str


@dataclass
class CalibrationReport:
    """What the calibration inputs showed, and the nodes it kept float32."""

    data: str
    batches: int
    overflow_threshold: float
    flush_threshold: float
    tensors_probed: int
    skipped: Dict[str, int] = field(default_factory=dict)
    at_risk: List[Risk] = field(default_factory=list)
    kept: List[KeptNode] = field(default_factory=list)

    def summary_lines(self) -> List[str]:
        lines = ["Calibration on %s (%d batch(es), %d half tensor(s) probed): %d at risk, %d node(s) kept "
                 "float32" % (self.data, self.batches, self.tensors_probed, len(self.at_risk),
                              len(self.kept))]
        lines.extend("  kept %s (%s): %s" % (node.name, node.op, node.reason) for node in self.kept)
        return lines


def calibration_batches(path: str, inputs: List[GraphTensor]) -> List[List[np.ndarray]]:
    """The batches of the .npz at ``path``: one per multiple of the inputs' fixed first dimension."""
    arrays = load_input_data(path, inputs)
    counts = set()
    for tensor, array in zip(inputs, arrays):
        first = tensor.shape[0] if tensor.shape else None
        rows = np.shape(array)[0] if np.ndim(array) else None
        counts.add(rows // first if first and rows and rows % first == 0 else 1)
    if len(counts) != 1 or counts == {1}:
        return [list(arrays)]
    count = counts.pop()
    return [[np.array_split(np.asarray(a), count)[i] for a in arrays] for i in range(count)]


def measure(saved: SavedGraph, io: GraphIO, rewritten_def, report, dtype: str,
            batches: List[List[np.ndarray]], initial_values: Optional[dict] = None,
            data: str = "the calibration data") -> Tuple[List[TensorRange], Dict[str, int]]:
    """The ranges of the half-bound tensors over ``batches`` (the original graph, in float32;
    ``initial_values``: a MetaGraph's variables without a checkpoint, as validation loads them;
    ``data``: what the batches are, for the error a failing run raises)."""
    import tensorflow as tf

    plan = plan_probes(saved.graph_def, rewritten_def, report)
    accumulator = RangeAccumulator(limits_for(dtype))
    values = {} if initial_values is None else initial_values
    with loaded_graph(saved, saved.path, saved.text, io, values) as (session, tensors):
        probe_ops = ProbeOps(session.graph, limits_for(dtype))
        probe_ops.add(plan.probes)
        outputs = [session.graph.get_tensor_by_name(name) for name in tensors["outputs"]]
        for values in batches:
            feed = input_feed(session, tensors, values)
            ids = probe_ops.select(outputs, [session.graph.get_tensor_by_name(name) for name in feed])
            if not ids:
                continue
            try:
                counts, extrema = session.run(probe_ops.fetches(ids), feed)
            except tf.compat.v1.errors.OpError as error:
                raise ConversionError("the original graph failed to run on %s: %s"
                                      % (data, op_error_text(error)),
                                      "Give inputs it runs on in float32 (shapes, dtypes, value "
                                      "ranges such as embedding indices)") from None
            accumulator.record([probe_ops.probes[i] for i in ids], counts, extrema)
    return accumulator.ranges(), plan.skipped


def calibrate(saved: SavedGraph, io: GraphIO, rewritten_def, report, dtype: str, path: str,
              batches: List[List[np.ndarray]], overflow_threshold: float = DEFAULT_OVERFLOW_THRESHOLD,
              flush_threshold: float = DEFAULT_FLUSH_THRESHOLD, initial_values: Optional[dict] = None
              ) -> Tuple[Dict[str, KeptNode], CalibrationReport]:
    """``({node: KeptNode}, CalibrationReport)`` for the conversion ``rewritten_def`` / ``report``."""
    ranges, skipped = measure(saved, io, rewritten_def, report, dtype, batches, initial_values,
                              data=path)
    risks = find_risks(ranges, limits_for(dtype), lambda _: 0, overflow_threshold, flush_threshold)
    ops = {n.name: n.op for risk in risks for n in risk.half_nodes}
    kept = {name: KeptNode(name, ops[name], CALIBRATION, reason)
            for name, reason in keep_float32(risks, dtype).items()}
    return kept, CalibrationReport(data=path, batches=len(batches), overflow_threshold=overflow_threshold,
                                   flush_threshold=flush_threshold, tensors_probed=len(ranges),
                                   skipped=dict(skipped), at_risk=risks, kept=list(kept.values()))

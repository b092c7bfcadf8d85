"""The precision doctor: what overflows or underflows in half, measured on a float32 run.

Entry points: ``probes.plan_probes(graph_def, rewritten, report)`` (which tensors the
rewrite would hold in half, and whether each is a forward value or a gradient),
``probe_ops.ProbeOps`` (their ranges as in-graph reductions, fetched together with a
run), ``ranges.RangeAccumulator`` (the ranges over steps and batches), ``advice`` (the
loss scale to use, and whether dynamic scaling is needed), ``fixes`` (which nodes must
stay float32, and the list edit that keeps them there), ``report.DoctorReport`` (all of
it as data and as text) and ``plot`` (the histogram of gradient magnitudes).

Training (``tfamp_rewrite.diagnose``, ``tfamp-rewrite doctor``) and saved-graph
conversion (``--calibration-data``, ``--auto-tune``) are the front doors onto it.

May import: the shared basics and ``graph_rewrite`` (whose decisions say what is half).
"""

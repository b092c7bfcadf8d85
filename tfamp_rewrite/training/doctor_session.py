"""Sessions that probe: the float32 graph runs, and what the rewrite would hold in half is measured.

Constructed instead of ``tf.compat.v1.Session`` / ``InteractiveSession`` while the
precision doctor runs (``activation.set_doctor``, which hands them the run as their
``doctor_run``).  Like ``session.Session`` they run a
private copy of the user's graph, kept in step as it grows and mapped by name -- but the
copy is the user's float32 graph itself (``ProbedGraph``): the rewrite only decides which
tensors would be half (``doctor.probes``), and ``doctor.probe_ops`` measures them.  Each
``run``::

    stop the program if the doctor has everything (StopDoctor)
    probes = the probed tensors this run computes anyway (ancestors of its fetches)
    while probing: also fetch their reductions and the loss scale the step multiplied
                   its loss by (the LossScaleOptimizer's, if any); record them and the time
    after: runs that would have probed gradients are timed, unprobed

``make_callable`` and ``partial_run`` run unprobed.
"""
from __future__ import annotations

import time

import tensorflow as tf

from ..doctor.limits import limits_for
from ..doctor.probe_ops import ProbeOps
from ..doctor.probes import GRADIENT_ROLES, plan_probes
from .loss_scale_optimizer import LOSS_SCALE_COLLECTION
from .session import TF_SESSION_CLASSES, _RewritingSession
from .shadow_graph import ShadowGraph, fetch_elements


class ProbedGraph(ShadowGraph):
    """A ShadowGraph holding the user's float32 graph plus the doctor's probes."""

    def __init__(self, user_graph, doctor):
        super().__init__(user_graph, doctor.target, doctor.dtype, "native", doctor.compat)
        self.doctor = doctor
        self.probe_ops = ProbeOps(self.graph, limits_for(doctor.dtype))

    def _graph_to_import(self, graph_def, result):
        return graph_def

    def _synced(self, graph_def, result, added, seconds) -> None:
        del added, seconds
        plan = plan_probes(graph_def, result.graph_def, result.report)
        self.probe_ops.add(plan.probes)
        self.doctor.skipped = dict(plan.skipped)


class _DoctorSession(_RewritingSession):
    """Mixin over a TensorFlow session class; see the module docstring."""

    def _make_shadow(self, dtype, numerics, compat, config, target):
        del dtype, numerics, compat, config, target  # the doctor run's settings decide
        doctor = getattr(self, "doctor_run", None)  # set when activation constructs it
        if doctor is None:
            raise RuntimeError("a probing session is made by tf.compat.v1.Session() while a doctor run "
                               "is set (tfamp_rewrite.training.activation.set_doctor), not directly")
        return ProbedGraph(self._user_graph, doctor)

    def _make_watch(self, auto_fix):
        del auto_fix
        return None  # the float32 graph runs: no step of it is skipped for half's sake

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        shadow = self._shadow
        doctor = shadow.doctor
        doctor.check()
        shadow.sync()
        mapped, feeds = self._map_fetches(fetches), self._map_feeds(feed_dict)
        fed = [key for key in (feeds or {}) if isinstance(key, tf.Tensor)]
        ids = shadow.probe_ops.select(fetch_elements(mapped), fed)
        probes = [shadow.probe_ops.probes[i] for i in ids]
        gradients = any(p.role in GRADIENT_ROLES for p in probes)
        if not probes or not doctor.probing:
            start = time.perf_counter()
            values = self._call_base(self._tensorflow_run, mapped, feeds, options, run_metadata)
            if gradients:
                doctor.record_plain(time.perf_counter() - start)
            return values
        extra = {"probes": shadow.probe_ops.fetches(ids)}
        scale = self._loss_scale_tensor() if gradients else None
        if scale is not None:
            extra["scale"] = scale
        start = time.perf_counter()
        values, measured = self._call_base(self._tensorflow_run, (mapped, extra), feeds, options,
                                           run_metadata)
        counts, extrema = measured["probes"]
        doctor.record(probes, counts, extrema, float(measured.get("scale", 1.0)), time.perf_counter() - start)
        return values

    @property
    def _tensorflow_run(self):
        """TensorFlow's own ``run`` (the rewriting session's would judge the doctor's probe
        values as the user's fetches)."""
        return super(_RewritingSession, self).run

    def _loss_scale_tensor(self):
        """The loss scale of the user graph's last LossScaleOptimizer, in the private graph."""
        scales = self._user_graph.get_collection(LOSS_SCALE_COLLECTION)
        return self._shadow.private_fetch(scales[-1]) if scales else None


class Session(_DoctorSession, TF_SESSION_CLASSES["Session"]):
    """A ``tf.compat.v1.Session`` that runs the float32 graph and probes it for the doctor."""


class InteractiveSession(_DoctorSession, TF_SESSION_CLASSES["InteractiveSession"]):
    """A ``tf.compat.v1.InteractiveSession`` that probes for the doctor."""

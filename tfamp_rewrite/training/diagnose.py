"""``tfamp_rewrite.diagnose``: what overflows or underflows in half, before a training run pays for it.

For graph-mode code: give it the loss (and, to measure real training steps, the train
op) and a way to feed batches; it runs float32 steps on a private copy of the loss's
graph -- the user's graph and sessions are untouched -- and measures every tensor the
mixed-precision rewrite would hold in half::

    private = import of loss.graph
    without train_op: gradients of loss w.r.t. var_list (default: the trainable variables)
    decisions = rewrite_graph_def(private, dtype, target)      # what would be half
    probes    = doctor.plan_probes(...) as in-graph reductions (doctor.probe_ops)
    initialise (init_fn(session), else every variable's initializer), then
    `steps` runs of train_op (or of the gradients: batches, weights unchanged),
    each fetching the probes and the loss scale the step used, if a LossScaleOptimizer
    scales the loss; then `plain_steps` unprobed runs, timed
    -> DoctorReport: tensors at risk with their fixes, the gradients' underflow without
       scaling and at the current and recommended scale, the recommended initial loss
       scale and whether dynamic scaling is needed
"""
from __future__ import annotations

import functools
import time
from typing import Callable, Optional

import tensorflow as tf

from ..doctor.limits import limits_for
from ..doctor.probe_ops import ProbeOps
from ..doctor.probes import GRADIENT_ROLES, plan_probes
from ..doctor.ranges import RangeAccumulator
from ..doctor.report import DoctorReport, build_report
from ..graph_rewrite.compat import session_compat
from ..graph_rewrite.rewrite import rewrite_graph_def
from ..tf_compat import config_without_tf_amp
from .loss_scale_optimizer import LOSS_SCALE_COLLECTION

tf1 = tf.compat.v1


def diagnose(loss, steps: int = 10, feed_fn: Optional[Callable[[], dict]] = None, train_op=None,
             var_list=None, init_fn: Optional[Callable] = None, dtype: str = "float16",
             target: str = "gpu", margin_log2: int = 3, plain_steps: int = 3, config=None,
             compat: Optional[str] = None) -> DoctorReport:
    """Runs float32 steps of ``loss``'s graph and reports what would go wrong in ``dtype``.

    Args:
      loss: the scalar loss tensor (graph mode).
      steps: probed runs (training steps with ``train_op``, else batches).
      feed_fn: called before each run; returns its feed dict (keys: the graph's tensors
        or their names).  None: the graph feeds itself (tf.data).
      train_op: the training op; its runs change the (private copy's) weights, and a
        ``LossScaleOptimizer``'s scale is read from each step.  None: the gradients of
        ``loss`` w.r.t. ``var_list`` (default: the trainable variables) are computed.
      init_fn: ``init_fn(session)`` initialises the variables (e.g. ``saver.restore``,
        which works by name); default: every variable's initializer and the tables'.
      dtype, target: the rewrite asked about (``"float16"`` / ``"bfloat16"``, ``"gpu"`` / ``"cpu"``).
      margin_log2: the recommended loss scale keeps the largest gradient this many powers
        of two below the largest finite half value.
      plain_steps: unprobed runs, timed, so the report says what probing costs.
      config: a ``ConfigProto`` for the session.
      compat: whose AMP pass the rewrite follows; default ``$TFAMP_REWRITE_COMPAT``, else the
        running TensorFlow's, as sessions do (graph_rewrite/compat.py).

    Raises:
      ValueError: bad arguments, or no gradient of ``loss`` reaches ``var_list``.
    """
    if steps < 1 or plain_steps < 0:
        raise ValueError("steps must be >= 1 and plain_steps >= 0; got %r and %r" % (steps, plain_steps))
    limits = limits_for(dtype)
    user_graph = loss.graph
    private = tf.Graph()
    with private.as_default():
        tf1.import_graph_def(user_graph.as_graph_def(), name="")
        private_loss = private.get_tensor_by_name(loss.name)
        if train_op is None:
            step = _gradients(private, private_loss, user_graph, var_list)
            scale = None
        else:
            step = [private.as_graph_element(train_op.name)]
            scales = user_graph.get_collection(LOSS_SCALE_COLLECTION)
            scale = private.get_tensor_by_name(scales[-1].name) if scales else None
        graph_def = private.as_graph_def()
        result = rewrite_graph_def(graph_def, dtype=dtype, target=target, compat=session_compat(compat))
        weights = [t.name for t in step if isinstance(t, tf.Tensor)]
        plan = plan_probes(graph_def, result.graph_def, result.report, weight_gradients=weights)
        probe_ops = ProbeOps(private, limits)
        probe_ops.add(plan.probes)
        accumulator = RangeAccumulator(limits)
        feeds = functools.partial(_private_feeds, private, feed_fn)
        with _PlainSession(graph=private, config=config_without_tf_amp(config)) as session:
            _initialise(session, user_graph, init_fn)
            for _ in range(steps):
                feed_dict = feeds()
                ids = probe_ops.select(step + [private_loss], list(feed_dict))
                fetches = {"step": step, "probes": probe_ops.fetches(ids)}
                gradients = any(probe_ops.probes[i].role in GRADIENT_ROLES for i in ids)
                if scale is not None and gradients:
                    fetches["scale"] = scale
                start = time.perf_counter()
                values = session.run(fetches, feed_dict)
                accumulator.record([probe_ops.probes[i] for i in ids], *values["probes"],
                                   scale=float(values.get("scale", 1.0)), seconds=time.perf_counter() - start)
            for _ in range(plain_steps):
                feed_dict = feeds()
                start = time.perf_counter()
                session.run(step, feed_dict)
                accumulator.plain_seconds.append(time.perf_counter() - start)
    notes = [] if train_op is not None else [
        "gradients of the loss were computed without a train op: %d batch(es), weights unchanged" % steps]
    return build_report(accumulator, dtype, target, plan.skipped, margin_log2=margin_log2, notes=notes)


class _PlainSession(tf1.Session):
    """TensorFlow's Session: the activation switch redirects only ``tf.compat.v1.Session`` itself."""


def _gradients(private, loss, user_graph, var_list):
    variables = list(var_list) if var_list is not None else user_graph.get_collection(
        tf1.GraphKeys.TRAINABLE_VARIABLES)
    if not variables:
        raise ValueError("diagnose needs variables to differentiate the loss by: pass var_list, or "
                         "train_op; the loss's graph has no trainable variables")
    # A variable's own op output (a resource handle or a ref) is what optimizers differentiate by.
    targets = [private.get_tensor_by_name(v.op.name + ":0") for v in variables]
    grads = [g for g in tf1.gradients(loss, targets, name="gradients") if g is not None]
    if not grads:
        raise ValueError("no gradient of %s reaches the variables %s" % (
            loss.name, ", ".join(v.op.name for v in variables[:5])))
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]


def _private_feeds(private, feed_fn):
    if feed_fn is None:
        return {}
    result = {}
    for key, value in (feed_fn() or {}).items():
        name = key if isinstance(key, str) else key.name
        result[private.as_graph_element(name, allow_tensor=True, allow_operation=False)] = value
    return result


def _initialise(session, user_graph, init_fn) -> None:
    if init_fn is not None:
        init_fn(session)
        return
    names = [v.initializer.name for v in user_graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
             + user_graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES)]
    names += [op.name for op in user_graph.get_collection(tf1.GraphKeys.TABLE_INITIALIZERS)]
    if names:
        session.run(names)

"""The two switches the examples compare: AMP (``--use_tf_amp``) and XLA (``--use_xla``).

* AMP is ``tfamp_rewrite.enable_mixed_precision_graph_rewrite(optimizer)``, the one line
  a TF1 script adds; ``amp_switch_restored`` puts the process-wide switch back when a run
  ends, so a process can run fp32 and AMP one after the other (tests, benchmarks, demo).
  Evaluation builds no optimizer, so it runs ``tfamp_rewrite.Session`` directly.
* XLA is auto-clustering, ``global_jit_level = ON_1`` in the session config.  TensorFlow
  auto-clusters CPU ops only with ``TF_XLA_FLAGS=--tf_xla_cpu_global_jit``, which it reads
  once per process, early (building a training graph, or listing devices, is enough);
  when no GPU will be used ``xla_session_config`` adds the flag to this process's
  environment, so call it before building anything -- in a process where TensorFlow has
  read the flags already it is too late: start a new one.
"""
from __future__ import annotations

import contextlib
import os
from typing import List, Optional

import tensorflow as tf

import tfamp_rewrite
from tfamp_rewrite.training import activation

tf1 = tf.compat.v1
CPU_JIT_FLAG = "--tf_xla_cpu_global_jit"


NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def gpus_visible() -> bool:
    """True if this TensorFlow is a CUDA build and the NVIDIA driver shows a GPU.

    Asked without TensorFlow's device listing, which would make it read TF_XLA_FLAGS before
    this module can set them; the build flag alone is not enough (TensorFlow 2.21's CPU
    wheel reports a CUDA build).
    """
    if not tf.test.is_built_with_cuda() or os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    try:
        return bool(os.listdir(NVIDIA_GPUS))
    except OSError:
        return False


def xla_session_config(use_xla: bool, notes: Optional[List[str]] = None) -> tf1.ConfigProto:
    """A session config with XLA auto-clustering on or off (see the module docstring)."""
    config = tf1.ConfigProto(allow_soft_placement=True)
    if not use_xla:
        return config
    config.graph_options.optimizer_options.global_jit_level = tf1.OptimizerOptions.ON_1
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if CPU_JIT_FLAG not in flags.split() and not gpus_visible():
        os.environ["TF_XLA_FLAGS"] = (flags + " " + CPU_JIT_FLAG).strip()
        if notes is not None:
            notes.append("no GPU: TF_XLA_FLAGS=%s set so that XLA clusters CPU ops"
                         % os.environ["TF_XLA_FLAGS"])
    return config


def wrap_optimizer(optimizer, use_tf_amp: bool):
    """``optimizer``, with loss scaling and the graph rewrite enabled when ``use_tf_amp``."""
    if not use_tf_amp:
        return optimizer
    return tfamp_rewrite.enable_mixed_precision_graph_rewrite(optimizer)


@contextlib.contextmanager
def amp_switch_restored():
    """Leaves the process-wide graph-rewrite switch as it was on entry."""
    was_enabled = activation.graph_rewrite_enabled()
    try:
        yield
    finally:
        if activation.graph_rewrite_enabled() and not was_enabled:
            tfamp_rewrite.disable_mixed_precision_graph_rewrite()


def session_class(use_tf_amp: bool):
    """The session class for a graph without an optimizer (evaluation)."""
    return tfamp_rewrite.Session if use_tf_amp else tf1.Session


def loss_scale_tensor(graph: tf.Graph):
    """The current dynamic loss scale of ``graph`` (a variable), or None without loss scaling.

    Found by name, so it also works when loss scaling was switched on by
    ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` instead of ``--use_tf_amp``.
    """
    for variable in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES):
        if variable.op.name.endswith("current_loss_scale"):
            return variable
    return None


def rewrite_line(session) -> str:
    """One line saying what the mixed-precision rewrite of ``session`` converted, if anything."""
    reports = getattr(session, "rewrite_reports", None)
    if not reports:
        return "mixed precision graph rewrite: off"
    report = reports[0]
    return ("mixed precision graph rewrite: converted %d/%d nodes to %s using %d cast(s) (target %s); "
            "fused unscale op: %s" % (
                report.nodes_converted, report.nodes_total, report.dtype,
                report.casts_to_half_excluding_constants, report.target,
                "built" if tfamp_rewrite.fused_op_available() else "composite TF ops"))

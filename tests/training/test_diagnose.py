"""tfamp_rewrite.diagnose on models made to misbehave in float16 (examples/doctor/misbehaving.py).

* overflow: the doctor names the planted square and the list edit that keeps it float32;
  with that edit in the environment, a mixed-precision session's loss is finite again.
* underflow (the loss times 1e-5): the doctor reports that most gradient values flush to
  zero unscaled and recommends a scale; training in float16 at that scale follows float32
  from the same seed step by step, and unscaled it does not (runs in half are emulated, so
  this CPU's half kernels do not decide).
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from repo_paths import EXAMPLES

import tfamp_rewrite
from tfamp_rewrite.training import activation

tf1 = tf.compat.v1
sys.path.insert(0, os.path.join(EXAMPLES, "doctor"))
import misbehaving  # noqa: E402


def diagnosed(problem, steps=5, with_train_op=True, amp=False, loss_scale="dynamic"):
    inputs, labels = misbehaving.make_data(problem)
    graph = tf.Graph()
    with graph.as_default():
        parts = misbehaving.build(problem, amp=amp, loss_scale=loss_scale)
    rng = np.random.default_rng(0)

    def feed():
        batch = rng.integers(0, len(labels), 64)
        return {parts["inputs"]: inputs[batch], "labels:0": labels[batch]}

    return tfamp_rewrite.diagnose(parts["loss"], steps=steps, feed_fn=feed,
                                  train_op=parts["train_op"] if with_train_op else None), parts


@pytest.fixture(scope="module")
def underflow():
    return diagnosed("underflow", with_train_op=False)[0]


def test_the_planted_overflow_is_named_with_its_fix(monkeypatch):
    report, _ = diagnosed("overflow")
    assert [r.node for r in report.overflow] == ["sum_of_squares/square"]
    risk = report.overflow[0]
    assert (risk.op, risk.category, risk.role) == ("Mul", "infer", "forward")
    assert risk.max_abs > 65504 and 0 < risk.fraction < 1
    assert risk.fix.lists == {"infer_remove": ["Mul"], "deny_add": ["Mul"]}
    assert "sum_of_squares/square" in report.summary() and risk.fix.env in report.summary()
    # The fix works: a mixed-precision session (emulated numerics) computes an inf loss
    # without it and a finite one with its variables set.
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    assert not math.isfinite(amp_loss("overflow"))
    for assignment in risk.fix.env.split():
        name, _, value = assignment.partition("=")
        monkeypatch.setenv(name, value)
    assert math.isfinite(amp_loss("overflow"))


def amp_loss(problem):
    inputs, labels = misbehaving.make_data(problem)
    graph = tf.Graph()
    with graph.as_default():
        parts = misbehaving.build(problem)
        with tfamp_rewrite.Session(graph=graph, numerics="emulate") as session:
            session.run(tf1.global_variables_initializer())
            feed = {parts["inputs"]: inputs[:256], parts["labels"]: labels[:256]}
            return float(session.run(parts["loss"], feed))


def test_the_underflow_is_measured_and_a_scale_recommended(underflow):
    advice = underflow.loss_scale
    assert underflow.steps == 5 and underflow.gradients.tensors > 0
    assert advice.unscaled.flush > 0.5 and advice.scaling_needed
    assert advice.at_recommended.flush < 0.01 and advice.at_recommended.overflow == 0
    assert advice.recommended >= 2 ** 10 and math.log2(advice.recommended).is_integer()
    assert underflow.overflow == []


def test_the_recommended_scale_trains_like_float32_and_no_scale_does_not(underflow, monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    emulated = lambda graph: tfamp_rewrite.Session(graph=graph, numerics="emulate")  # noqa: E731
    steps = 120
    fp32 = misbehaving.train("underflow", steps)["losses"]
    scaled = misbehaving.train("underflow", steps, amp=True, loss_scale=underflow.loss_scale.recommended,
                               session_factory=emulated)["losses"]
    unscaled = misbehaving.train("underflow", steps, amp=True, loss_scale=1,
                                 session_factory=emulated)["losses"]
    activation.deactivate()

    def deviation(losses):
        return max(abs(a - b) / b for a, b in zip(losses, fp32))

    assert fp32[-1] < 0.3 * fp32[0]                       # float32 learns
    assert deviation(scaled) < 0.02                       # the recommended scale follows it
    assert deviation(unscaled) > 0.1                      # unscaled, flushed gradients do not


def test_the_loss_scale_a_step_used_is_read_and_undone():
    """A LossScaleOptimizer's gradients are scaled: unscaled, they are the plain ones."""
    plain, _ = diagnosed("underflow", steps=1)
    scaled, _ = diagnosed("underflow", steps=1, amp=True, loss_scale=1024)
    assert plain.scales == [1.0] and scaled.scales == [1024.0]
    assert scaled.loss_scale.current == 1024 and scaled.loss_scale.at_current.scale == 1024
    assert scaled.loss_scale.unscaled.flush == pytest.approx(plain.loss_scale.unscaled.flush)
    assert scaled.loss_scale.max_gradient == pytest.approx(plain.loss_scale.max_gradient, rel=1e-6)


def test_the_report_round_trips_and_roles_are_counted(underflow):
    again = tfamp_rewrite.DoctorReport.from_dict(underflow.to_dict())
    assert again == underflow
    assert underflow.gradients.weight_tensors > 0 and underflow.gradients.activation_tensors > 0
    assert underflow.timing.probed_steps == 5 and underflow.timing.plain_steps == 3

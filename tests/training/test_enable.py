"""enable_mixed_precision_graph_rewrite / disable_…: wrapping, the flag, the warnings."""
from __future__ import annotations

import gc
import logging

import pytest
import tensorflow as tf
from loss_scaling_problems import SCALE, build, run
from tf_api import keras_loss_scale_optimizer, keras_sgd, set_keras_global_policy

from tfamp_rewrite import (
    DynamicLossScale,
    FixedLossScale,
    LossScaleOptimizer,
    disable_mixed_precision_graph_rewrite,
    enable_mixed_precision_graph_rewrite,
)
from tfamp_rewrite.training import activation, enable

tf1 = tf.compat.v1
LOGGER = "tfamp_rewrite.training.enable"


@pytest.fixture(autouse=True)
def rewrite_disabled_around_each_test(monkeypatch):
    activation.disable_graph_rewrite()
    monkeypatch.setattr(enable, "_warned_about_existing_sessions", False)
    yield
    activation.disable_graph_rewrite()


def sgd():
    return tf1.train.GradientDescentOptimizer(0.1)


def test_enable_wraps_with_dynamic_loss_scaling_and_sets_the_flag():
    inner = sgd()
    wrapped = enable_mixed_precision_graph_rewrite(inner)
    assert isinstance(wrapped, LossScaleOptimizer) and wrapped._optimizer is inner
    scale = wrapped.loss_scale
    assert isinstance(scale, DynamicLossScale)
    assert (scale.initial_loss_scale, scale.increment_period, scale.multiplier) == (
        2.0**15, 2000, 2.0)
    assert activation.graph_rewrite_enabled()


def test_enable_takes_a_loss_scale_like_tensorflow():
    assert enable_mixed_precision_graph_rewrite(sgd(), 128).loss_scale.value == 128.0
    mine = FixedLossScale(8)
    assert enable_mixed_precision_graph_rewrite(sgd(), loss_scale=mine).loss_scale is mine


def test_two_fresh_optimizers_can_both_be_enabled():
    first = enable_mixed_precision_graph_rewrite(sgd())
    second = enable_mixed_precision_graph_rewrite(sgd())
    assert first is not second and activation.graph_rewrite_enabled()


def test_disable_clears_the_flag_and_loss_scaling_stays():
    problem = build(lambda: enable_mixed_precision_graph_rewrite(
        tf1.train.MomentumOptimizer(0.1, 0.9)))
    disable_mixed_precision_graph_rewrite()
    assert not activation.graph_rewrite_enabled()
    (state_after_overflow,) = run(problem, [float("inf")])
    assert state_after_overflow[SCALE] == 2.0**14
    assert state_after_overflow["global_step"] == 0


@pytest.mark.parametrize(
    "make_opt, loss_scale, message",
    [
        pytest.param(lambda: enable_mixed_precision_graph_rewrite(sgd()), "dynamic",
                     "wrap an optimizer once", id="enable_twice"),
        pytest.param(lambda: LossScaleOptimizer(sgd()), "dynamic", "wrap an optimizer once",
                     id="already_wrapped"),
        pytest.param(lambda: keras_loss_scale_optimizer(keras_sgd()),
                     "dynamic", "Keras LossScaleOptimizer", id="keras_loss_scale_optimizer"),
        pytest.param(keras_sgd, "dynamic", "Keras optimizers have their own loss scaling",
                     id="keras_optimizer"),
        pytest.param(lambda: 0.1, "dynamic", "Expected a tf.compat.v1.train.Optimizer",
                     id="not_optimizer"),
        pytest.param(sgd, "static", "loss_scale must be 'dynamic'", id="bad_loss_scale"),
        pytest.param(sgd, None, "needs a loss scale; got None", id="no_loss_scale"),
    ],
)
def test_enable_rejects_and_leaves_the_rewrite_off(make_opt, loss_scale, message):
    opt = make_opt()
    activation.disable_graph_rewrite()
    with pytest.raises(ValueError, match=message):
        enable_mixed_precision_graph_rewrite(opt, loss_scale)
    assert not activation.graph_rewrite_enabled()


@pytest.mark.tf2_behavior("Keras' global dtype policy (V2 dtype behaviour)")
def test_enable_refuses_when_keras_mixed_precision_policy_is_set():
    set_keras_global_policy("mixed_float16")
    try:
        with pytest.raises(ValueError, match="Keras global dtype policy"):
            enable_mixed_precision_graph_rewrite(sgd())
    finally:
        set_keras_global_policy("float32")
    assert not activation.graph_rewrite_enabled()
    enable_mixed_precision_graph_rewrite(sgd())  # fine again with the default policy


def _session_warnings(caplog):
    return [r for r in caplog.records if r.name == LOGGER and "Session" in r.getMessage()]


def test_warns_once_about_sessions_that_already_exist(caplog):
    gc.collect()  # sessions other tests dropped without closing
    with tf.Graph().as_default():
        session = tf1.Session()
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            enable_mixed_precision_graph_rewrite(sgd())
            enable_mixed_precision_graph_rewrite(sgd())
    finally:
        session.close()
    (warning,) = _session_warnings(caplog)
    assert "only to Sessions created after" in warning.getMessage()


def test_no_warning_for_closed_sessions(caplog):
    with tf.Graph().as_default():
        closed = tf1.Session()
    closed.close()
    gc.collect()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        enable_mixed_precision_graph_rewrite(sgd())
    assert _session_warnings(caplog) == []
    assert closed is not None  # alive, but closed: it could not run anything anyway


def test_disable_when_already_disabled_warns(caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        disable_mixed_precision_graph_rewrite()
    assert any("already disabled" in r.getMessage() for r in caplog.records)

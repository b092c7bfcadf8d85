"""Loss scales: the update rule on numpy values, its graph form, state, and ``get``."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
from tf_api import tf_loss_scaling

from tfamp_rewrite.training import loss_scale
from tfamp_rewrite.training.loss_scale import (
    DynamicLossScale,
    FixedLossScale,
    next_dynamic_loss_scale,
)

tf1 = tf.compat.v1
RULE = {"increment_period": 3, "multiplier": 2.0, "min_loss_scale": 1.0}


def step(scale, good_steps, all_finite, **rule):
    """One step of the rule on numpy float32/int64 values, as plain Python numbers."""
    with np.errstate(over="ignore"):  # an overflowing grow is part of the rule
        new_scale, new_good = next_dynamic_loss_scale(
            np.float32(scale), np.int64(good_steps), np.bool_(all_finite), **dict(RULE, **rule)
        )
    return float(new_scale), int(new_good)


# ---- the rule, step by step ---------------------------------------------------------


@pytest.mark.parametrize(
    "scale, good_steps, all_finite, expected",
    [
        pytest.param(8.0, 0, True, (8.0, 1), id="finite_counts"),
        pytest.param(8.0, 1, True, (8.0, 2), id="finite_counts_again"),
        pytest.param(8.0, 2, True, (16.0, 0), id="finite_at_period_grows_and_resets"),
        pytest.param(8.0, 2, False, (4.0, 0), id="overflow_shrinks_and_resets"),
        pytest.param(8.0, 0, False, (4.0, 0), id="overflow_on_fresh_count"),
        pytest.param(1.5, 1, False, (1.0, 0), id="overflow_stops_at_floor"),
        pytest.param(1.0, 0, False, (1.0, 0), id="overflow_at_floor_stays"),
    ],
)
def test_rule_single_step(scale, good_steps, all_finite, expected):
    assert step(scale, good_steps, all_finite) == expected


def test_rule_grows_only_when_the_result_is_finite():
    largest_power = float(2**127)  # doubling it overflows float32
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(largest_power) * np.float32(2)), "premise: grow overflows"
    assert step(largest_power, 2, True) == (largest_power, 0)


def test_rule_uses_its_multiplier_and_floor():
    assert step(81.0, 2, True, multiplier=3.0) == (243.0, 0)
    assert step(81.0, 0, False, multiplier=3.0) == (27.0, 0)
    assert step(5.0, 0, False, min_loss_scale=4.0) == (4.0, 0)


def test_rule_floors_after_100_overflows():
    scale, good_steps = 2.0**15, 0
    for _ in range(100):
        scale, good_steps = step(scale, good_steps, False, min_loss_scale=0.25)
    assert (scale, good_steps) == (0.25, 0)


def test_rule_period_of_one_grows_every_finite_step():
    scale, good_steps = 1.0, 0
    for _ in range(5):
        scale, good_steps = step(scale, good_steps, True, increment_period=1)
    assert (scale, good_steps) == (32.0, 0)


# ---- the same rule in a graph -------------------------------------------------------


def test_graph_update_follows_the_rule_over_a_random_run():
    flags = np.random.RandomState(7).rand(60) < 0.8
    dynamic = DynamicLossScale(initial_loss_scale=4.0, **RULE)
    with tf.Graph().as_default() as graph:
        finite = tf1.placeholder(tf.bool, [])
        update_op, should_apply = dynamic.update(finite)
        scale_var, good_steps_var = dynamic.variables()
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            expected = (4.0, 0)
            for flag in flags:
                _, applied = session.run([update_op, should_apply], {finite: flag})
                expected = step(*expected, flag)
                assert applied == flag
                assert session.run([scale_var, good_steps_var]) == list(expected)
    assert expected != (4.0, 0), "the run should have moved the scale"


# ---- state: lazy, per graph, non-trainable, summarised ------------------------------


def test_state_is_created_lazily_in_each_graph_that_uses_it():
    dynamic = DynamicLossScale(initial_loss_scale=64.0)
    first, second = tf.Graph(), tf.Graph()
    with first.as_default():
        assert dynamic.variables() == []
        value = dynamic()
    with second.as_default():
        second_value = dynamic()
        second_state = dynamic.variables()
    assert value.graph is first and second_value.graph is second
    assert {v.graph for v in second_state} == {second}
    for graph in (first, second):
        with graph.as_default():
            names = [v.op.name for v in tf1.global_variables()]
            assert names == ["loss_scale/current_loss_scale", "loss_scale/good_steps"]
            assert tf1.trainable_variables() == []
            with tf1.Session(graph=graph) as session:
                session.run(tf1.global_variables_initializer())
                assert session.run(dynamic()) == 64.0


def test_state_is_created_outside_control_flow():
    dynamic = DynamicLossScale(initial_loss_scale=8.0)
    with tf.Graph().as_default() as graph:
        pick = tf1.placeholder(tf.bool, [])
        value = tf1.cond(pick, lambda: dynamic() * 2.0, lambda: dynamic())
        assert [v.graph for v in dynamic.variables()] == [graph, graph]
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            assert session.run(value, {pick: True}) == 16.0


def test_scale_summary_is_in_merge_all():
    dynamic = DynamicLossScale(initial_loss_scale=512.0)
    with tf.Graph().as_default() as graph:
        dynamic()
        merged = tf1.summary.merge_all()
        assert merged is not None
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            summary = tf1.Summary.FromString(session.run(merged))
    assert [(v.tag, v.simple_value) for v in summary.value] == [
        ("current_loss_scale", 512.0)
    ]


def test_loss_scale_does_not_keep_graphs_alive():
    dynamic = DynamicLossScale()
    graph = tf.Graph()
    with graph.as_default():
        dynamic()
    graph_ref = weakref.ref(graph)
    del graph
    gc.collect()
    assert graph_ref() is None


@pytest.mark.tf2_behavior("eager execution")
def test_eager_use_is_a_runtime_error():
    assert tf1.executing_eagerly(), "premise: TF 2 runs eagerly outside a graph"
    with pytest.raises(RuntimeError, match="Graph"):
        DynamicLossScale()()


# ---- fixed scale ---------------------------------------------------------------------


def test_fixed_loss_scale_is_constant_and_always_applies():
    fixed = FixedLossScale(128)
    with tf.Graph().as_default() as graph:
        update_op, should_apply = fixed.update(tf1.constant(False))
        with tf1.Session(graph=graph) as session:
            session.run(update_op)
            assert session.run(fixed()) == 128.0
    assert should_apply is True
    assert fixed.variables() == []


# ---- get() and argument checks --------------------------------------------------------


def test_get_follows_tensorflow_rules():
    dynamic = loss_scale.get("dynamic")
    assert isinstance(dynamic, DynamicLossScale)
    assert (dynamic.initial_loss_scale, dynamic.increment_period, dynamic.multiplier) == (
        2.0**15, 2000, 2.0)
    assert dynamic.min_loss_scale == 1.0
    assert loss_scale.get(256).value == 256.0
    assert loss_scale.get(np.float32(8.0)).value == 8.0
    assert loss_scale.get(dynamic) is dynamic
    assert loss_scale.get(None) is None


@pytest.mark.parametrize(
    "identifier, message",
    [
        ("Dynamic", "'dynamic', a number >= 1"),
        (0.5, "FixedLossScale value must be a finite number >= 1"),
        (float("inf"), "FixedLossScale value must be a finite number >= 1"),
        (True, "'dynamic', a number >= 1"),
        ([8], "'dynamic', a number >= 1"),
    ],
    ids=["misspelled", "below_one", "infinite", "bool", "list"],
)
def test_get_rejects_with_what_is_allowed(identifier, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        loss_scale.get(identifier)


def test_get_rejects_tensorflows_own_loss_scale_by_name():
    with tf.Graph().as_default():
        theirs = tf_loss_scaling().DynamicLossScale()
    with pytest.raises(ValueError, match="tfamp_rewrite.DynamicLossScale"):
        loss_scale.get(theirs)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"multiplier": 1.0}, "multiplier must be a finite number > 1"),
        ({"increment_period": 0}, "increment_period must be a whole number of steps >= 1"),
        ({"increment_period": 2.5}, "increment_period must be a whole number"),
        ({"min_loss_scale": 0.0}, "min_loss_scale must be a finite number > 0"),
        ({"initial_loss_scale": 2.0, "min_loss_scale": 4.0}, "initial_loss_scale must be"),
        ({"initial_loss_scale": float("nan")}, "initial_loss_scale must be"),
    ],
    ids=["multiplier_one", "period_zero", "period_fraction", "floor_zero", "start_below_floor",
         "start_nan"],
)
def test_dynamic_loss_scale_rejects_bad_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        DynamicLossScale(**arguments)

"""LossScaleOptimizer: skipped steps, the scale's trajectory, gradients, state, forwarding."""
from __future__ import annotations

import copy
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from loss_scaling_problems import (
    GOOD_STEPS,
    SCALE,
    assert_same_values,
    build,
    global_state,
    run,
    without_loss_scale,
)
from model_graphs import control_flow_v1
from tf_api import keras_loss_scale_optimizer, keras_sgd, tf_loss_scaling

import tfamp_rewrite
from tfamp_rewrite import DynamicLossScale, FixedLossScale, LossScaleOptimizer

tf1 = tf.compat.v1
INF, NAN = float("inf"), float("nan")


def momentum():
    return tf1.train.MomentumOptimizer(0.05, momentum=0.9)


def adam():
    return tf1.train.AdamOptimizer(0.05)


def wrapped(make_inner, **dynamic):
    return lambda: LossScaleOptimizer(make_inner(), DynamicLossScale(**dynamic))


# ---- skipped steps and the scale's trajectory ------------------------------------------


@pytest.mark.parametrize("make_inner", [momentum, adam], ids=["momentum", "adam"])
@pytest.mark.parametrize("poison", [INF, NAN], ids=["inf", "nan"])
def test_non_finite_step_changes_nothing_but_halves_the_scale(make_inner, poison):
    problem = build(wrapped(make_inner, initial_loss_scale=2.0**10))
    before, skipped, after = run(problem, [1.0, poison, 1.0])[-3:]
    assert_same_values(without_loss_scale(skipped), without_loss_scale(before))
    assert skipped[SCALE] == before[SCALE] / 2 == 2.0**9
    assert skipped[GOOD_STEPS] == 0
    assert after["global_step"] == before["global_step"] + 1
    assert not np.array_equal(after["w"], skipped["w"])


def test_100_consecutive_overflows_stop_at_min_loss_scale():
    problem = build(wrapped(momentum, min_loss_scale=4.0))
    states = run(problem, [INF] * 100)
    assert [s[SCALE] for s in states[:3]] == [2.0**14, 2.0**13, 2.0**12]
    assert states[-1][SCALE] == 4.0
    assert states[-1]["global_step"] == 0


def test_scale_doubles_after_each_increment_period_of_good_steps():
    problem = build(wrapped(momentum, initial_loss_scale=8.0, increment_period=5))
    scales = [s[SCALE] for s in run(problem, [1.0] * 10)]
    assert scales == [8.0] * 4 + [16.0] * 5 + [32.0]


def test_scale_does_not_grow_into_overflow():
    largest = 2.0**127  # float32 holds it; twice it is inf
    problem = build(wrapped(momentum, initial_loss_scale=largest, increment_period=1))
    (state,) = run(problem, [1e-30])  # a loss this small keeps the scaled gradients finite
    assert state[SCALE] == largest
    assert state["global_step"] == 1


def test_fixed_scale_applies_every_step_as_tensorflow_does():
    problem = build(lambda: LossScaleOptimizer(momentum(), FixedLossScale(16)))
    (state,) = run(problem, [INF])
    assert state["global_step"] == 1
    assert not np.isfinite(state["w"]).all()


def _trajectory(make_optimizer, overflows):
    states = run(build(make_optimizer), overflows)
    # TensorFlow names its scale variable `current_loss_scale`, this package
    # `loss_scale/current_loss_scale`; compare under one name.
    return [{name.replace("loss_scale/", ""): v for name, v in s.items()} for s in states]


def test_same_trajectory_as_tensorflows_loss_scale_optimizer():
    overflows = np.random.RandomState(3).choice([1.0, 1.0, 1.0, INF, NAN], size=40).tolist()

    def ours():
        return LossScaleOptimizer(momentum(), DynamicLossScale(16.0, increment_period=3))

    def tensorflows():
        scale = tf_loss_scaling().DynamicLossScale(16.0, increment_period=3)
        return tf_loss_scaling().MixedPrecisionLossScaleOptimizer(momentum(), scale)

    expected = _trajectory(tensorflows, overflows)
    actual = _trajectory(ours, overflows)
    assert len({float(s["current_loss_scale"]) for s in actual}) > 3, "the scale should move"
    assert len(actual) == len(expected) == 40
    for mine, theirs in zip(actual, expected):
        assert_same_values(mine, theirs)


# ---- the gradients -------------------------------------------------------------------


def _gradient_values(make_optimizer):
    """The values compute_gradients returns on the regression problem."""
    grads = {}

    def minimize(optimizer, loss, global_step):
        pairs = optimizer.compute_gradients(loss)
        grads.update({v.op.name: g for g, v in pairs})
        return optimizer.apply_gradients(pairs, global_step=global_step)

    problem = build(make_optimizer, minimize=minimize)
    with tf1.Session(graph=problem.graph) as session:
        session.run(tf1.global_variables_initializer())
        present = {name: g for name, g in grads.items() if g is not None}
        values = dict(zip(present, session.run(list(present.values()))))
    return {name: values.get(name) for name in grads}


def test_compute_gradients_returns_unscaled_gradients():
    plain = _gradient_values(momentum)
    scaled = _gradient_values(wrapped(momentum, initial_loss_scale=2.0**12))
    assert_same_values(scaled, plain)


def test_callable_loss_is_scaled_too():
    def gradient(optimizer):
        with tf.Graph().as_default():
            w = tf1.get_variable("w", initializer=[0.5, 2.0], use_resource=True)
            pairs = optimizer.compute_gradients(lambda: tf1.reduce_sum(w * w * 3.0), [w])
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                return session.run(pairs[0][0])

    np.testing.assert_array_equal(gradient(wrapped(momentum)()), [3.0, 12.0])
    np.testing.assert_array_equal(gradient(momentum()), [3.0, 12.0])


def test_none_gradient_passes_through_and_its_variable_stays():
    def minimize(optimizer, loss, global_step):
        with tf1.variable_scope("unrelated"):
            tf1.get_variable("v", initializer=[3.0], use_resource=True)
        var_list = [v for v in tf1.global_variables() if v.op.name in ("w", "b", "unrelated/v")]
        pairs = optimizer.compute_gradients(loss, var_list=var_list)
        assert [g is None for g, _ in pairs] == [False, False, True]
        return optimizer.apply_gradients(pairs, global_step=global_step)

    (state,) = run(build(wrapped(momentum), minimize=minimize), [1.0])
    assert state["unrelated/v"] == [3.0]
    assert state["global_step"] == 1


def test_indexed_slices_gradients_are_unscaled_and_skipped_like_dense_ones():
    graph = tf.Graph()
    with graph.as_default():
        overflow = tf1.placeholder_with_default(1.0, [])
        table = tf1.get_variable("table", initializer=np.ones([5, 2], np.float32),
                                 use_resource=True)
        rows = tf1.nn.embedding_lookup(table, [1, 3, 3])
        loss = tf1.reduce_sum(tf1.square(rows) * [[1.0, 2.0]]) * overflow
        optimizer = LossScaleOptimizer(momentum(), DynamicLossScale(2.0**10))
        ((grad, _),) = optimizer.compute_gradients(loss)
        train_op = optimizer.apply_gradients([(grad, table)])
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            values, indices = session.run([grad.values, grad.indices])
            session.run(train_op, {overflow: INF})
            after_skip = session.run(table)
            session.run(train_op)
            after_step = session.run(table)
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(indices, [1, 3, 3])
    np.testing.assert_array_equal(values, [[2.0, 4.0]] * 3)  # d/drow of row**2 * [1, 2]
    np.testing.assert_array_equal(after_skip, np.ones([5, 2]))
    changed_rows = np.flatnonzero((after_step != 1.0).any(axis=1))
    np.testing.assert_array_equal(changed_rows, [1, 3])


def test_gradients_may_be_transformed_between_compute_and_apply():
    def clip(optimizer, loss, global_step):
        pairs = optimizer.compute_gradients(loss)
        clipped, _ = tf1.clip_by_global_norm([g for g, _ in pairs], 0.1)
        return optimizer.apply_gradients(
            list(zip(clipped, [v for _, v in pairs])), global_step=global_step)

    plain = run(build(momentum, minimize=clip), [1.0, 1.0])
    scaled = run(build(wrapped(momentum, initial_loss_scale=2.0**12), minimize=clip),
                 [1.0, 1.0, INF])
    for mine, theirs in zip(scaled, plain):
        np.testing.assert_allclose(mine["w"], theirs["w"], rtol=1e-6)
    assert_same_values(without_loss_scale(scaled[2]), without_loss_scale(scaled[1]))
    assert scaled[2][SCALE] == 2.0**11


def test_a_clip_that_makes_an_inf_gradient_finite_still_skips_the_step():
    """clip_by_value between compute_gradients and apply_gradients turns inf into 1: the step
    must be skipped on what compute_gradients saw, as PyTorch's GradScaler checks before it."""
    graph = tf.Graph()
    with graph.as_default():
        poison = tf1.placeholder(tf.float32, [])
        w = tf1.get_variable("w", initializer=[1.0, 1.0], use_resource=True)
        optimizer = LossScaleOptimizer(momentum(), "dynamic")
        pairs = optimizer.compute_gradients(tf1.reduce_sum(w * w) * poison)
        train = optimizer.apply_gradients([(tf.clip_by_value(g, -1.0, 1.0), v) for g, v in pairs])
        scale = optimizer.loss_scale()
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(train, {poison: np.inf})
            np.testing.assert_array_equal(session.run(w), [1.0, 1.0])
            assert session.run(scale) == 2.0**14
            session.run(train, {poison: 1.0})
            assert (session.run(w) < 1.0).all()


def test_accumulated_gradients_are_applied_in_a_run_that_computes_no_loss():
    """BERT-style accumulation: compute_gradients' results are summed into variables over
    runs, and another run applies them, feeding nothing and pulling no batch. An inf that
    reached an accumulator still skips the step."""
    graph = tf.Graph()
    with graph.as_default():
        batches = tf1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices(np.arange(1, 9, dtype=np.float32)).batch(1))
        poison = tf1.placeholder(tf.float32, [])
        w = tf1.get_variable("w", initializer=[1.0])
        optimizer = LossScaleOptimizer(momentum(), "dynamic")
        ((grad, var),) = optimizer.compute_gradients(tf1.reduce_sum(w * batches.get_next()) * poison)
        accumulator = tf1.get_variable("accumulator", initializer=[0.0], trainable=False)
        accumulate = accumulator.assign_add(grad)
        apply = optimizer.apply_gradients([(accumulator / 2.0, var)])
        zero = accumulator.assign([0.0])
        scale = optimizer.loss_scale()
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            for poisoned in (False, True, False):
                session.run(zero)
                for _ in range(2):
                    session.run(accumulate, {poison: np.inf if poisoned else 1.0})
                before = session.run(w)
                session.run(apply)  # no feed: the loss is not computed again
                assert (session.run(w) == before).all() == poisoned
            assert session.run(scale) == 2.0**14  # one skipped step
            with pytest.raises(tf.errors.OutOfRangeError):  # 6 batches were left to pull
                for _ in range(3):
                    session.run(accumulate, {poison: 1.0})


def test_gradients_summed_in_a_tf1_while_loop_are_applied_after_it():
    """compute_gradients in a loop body, summed in loop variables, applied after the loop:
    the body's finite flag cannot leave the loop, the sum's own check decides."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        poison = tf1.placeholder_with_default(1.0, [])
        w = tf1.get_variable("w", initializer=[1.0, 2.0])
        optimizer = LossScaleOptimizer(momentum(), "dynamic")

        def body(i, total):
            loss = tf1.reduce_sum(tf.square(w * tf.cast(i + 1, tf.float32))) * poison
            ((grad, _),) = optimizer.compute_gradients(loss, [w])
            return i + 1, total + grad

        _, summed = tf1.while_loop(lambda i, _: i < 3, body, [0, tf.zeros([2])])
        train = optimizer.apply_gradients([(summed / 3.0, w)])
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(train, {poison: np.inf})
            np.testing.assert_array_equal(session.run(w), [1.0, 2.0])
            session.run(train)
            assert (session.run(w) < [1.0, 2.0]).all()


@pytest.mark.parametrize("clipped", [False, True], ids=["as_computed", "clipped"])
def test_a_programs_own_finite_guard_around_apply_gradients_still_lowers_the_scale(clipped):
    """``tf.cond(is_finite(global_norm), apply, no_op)``: float32 skips the rare bad batch.
    The loss-scaled step's check and the scale's update are built outside the guard's
    branch, so a scale the first step overflows at comes down, rather than the guard
    skipping every step after it (a StopAtStepHook then never stopped)."""
    def guarded(optimizer, loss, global_step):
        grads_and_vars = optimizer.compute_gradients(loss)
        grads = [g for g, _ in grads_and_vars]
        if clipped:
            grads, _ = tf1.clip_by_global_norm(grads, 100.0)
        finite = tf1.is_finite(tf1.global_norm(grads))
        return tf1.cond(finite, lambda: optimizer.apply_gradients(
            zip(grads, [v for _, v in grads_and_vars]), global_step=global_step), tf.no_op)

    with control_flow_v1():
        problem = build(wrapped(momentum, initial_loss_scale=2.0**10), minimize=guarded)
    states = run(problem, [INF, INF, 1.0, 1.0])
    assert [s[SCALE] for s in states] == [2.0**9, 2.0**8, 2.0**8, 2.0**8]
    assert [int(s["global_step"]) for s in states] == [0, 0, 1, 2]


def test_a_variable_given_as_the_gradient_is_checked_as_read():
    """nshepperd/gpt-2's AccumulatingOptimizer applies [(accumulator_variable, var)]."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=[1.0, 2.0])
        accumulator = tf1.get_variable("accumulator", initializer=[0.5, 0.5], trainable=False)
        train = LossScaleOptimizer(momentum(), "dynamic").apply_gradients([(accumulator, w)])
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(train)
            np.testing.assert_allclose(session.run(w), [0.975, 1.975])  # lr 0.05 x 0.5
            session.run(accumulator.assign([np.inf, 0.0]))
            session.run(train)
            np.testing.assert_allclose(session.run(w), [0.975, 1.975])  # skipped


def test_gradients_scaled_by_another_optimizer_are_said_to_be(caplog, monkeypatch):
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    with tf.Graph().as_default():
        w = tf1.get_variable("w", initializer=[1.0, 1.0], use_resource=True)
        pairs = LossScaleOptimizer(momentum()).compute_gradients(tf1.reduce_sum(w * w))
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            LossScaleOptimizer(adam()).apply_gradients(pairs)
    said = [r.getMessage() for r in caplog.records if "another optimizer's loss scale" in r.getMessage()]
    assert len(said) == 1 and not [r for r in caplog.records if "unscaled loss" in r.getMessage()]


def test_loss_scaling_keeps_float16_gradients_from_underflowing():
    def gradient(optimizer):
        with tf.Graph().as_default():
            w = tf1.get_variable("w", initializer=[1.0], use_resource=True)
            small = np.float16(1e-4)  # representable in float16, but not its square
            loss = tf1.cast(tf1.reduce_sum(tf1.cast(w, tf.float16) * small * small), tf.float32)
            ((grad, _),) = optimizer().compute_gradients(loss)
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                return session.run(grad)[0]

    assert gradient(lambda: tf1.train.GradientDescentOptimizer(1.0)) == 0.0  # premise
    rescued = gradient(lambda: LossScaleOptimizer(
        tf1.train.GradientDescentOptimizer(1.0), FixedLossScale(2**14)))
    assert rescued == pytest.approx(1e-8, rel=0.01)


def test_training_converges_with_dynamic_loss_scaling_in_float16():
    features = np.random.RandomState(1).normal(size=(64, 8)).astype(np.float32)
    targets = features @ np.linspace(-1.0, 1.0, 8).astype(np.float32)
    with tf.Graph().as_default():
        w = tf1.get_variable("w", shape=[8, 1], initializer=tf1.zeros_initializer(),
                             use_resource=True)
        prediction = tf1.matmul(tf1.constant(features, tf.float16), tf1.cast(w, tf.float16))
        error = tf1.cast(prediction[:, 0], tf.float32) - targets
        loss = tf1.reduce_mean(tf1.square(error))
        optimizer = LossScaleOptimizer(tf1.train.MomentumOptimizer(0.05, 0.9), "dynamic")
        train_op = optimizer.minimize(loss)
        scale = optimizer.loss_scale()
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            initial_loss = session.run(loss)
            for _ in range(150):
                session.run(train_op)
            final_loss, final_scale = session.run([loss, scale])
    assert final_loss < initial_loss * 0.01
    assert final_scale < 2.0**15, "the float16 gradients should have overflowed at first"


# ---- state: graphs, checkpoints, collections ----------------------------------------------


def test_optimizer_built_outside_the_losss_graph_keeps_state_with_the_loss():
    optimizer = LossScaleOptimizer(momentum(), DynamicLossScale(32.0))  # like an Estimator
    for _ in range(2):
        problem = build(lambda: optimizer)
        with problem.graph.as_default():
            names = {v.op.name for v in tf1.global_variables()}
            state_graphs = {v.graph for v in optimizer.variables()}
        assert {SCALE, GOOD_STEPS} <= names and state_graphs == {problem.graph}
        assert run(problem, [INF])[0][SCALE] == 16.0


def test_saver_saves_and_restores_the_loss_scale(tmp_path):
    make = wrapped(momentum, initial_loss_scale=64.0, increment_period=10)
    trained = build(make)
    with tf1.Session(graph=trained.graph) as session:
        with trained.graph.as_default():
            session.run(tf1.global_variables_initializer())
            saver = tf1.train.Saver()
        saved = run(trained, [INF, INF, 1.0, 1.0], session=session)[-1]
        path = saver.save(session, os.path.join(str(tmp_path), "model"))
    assert (saved[SCALE], saved[GOOD_STEPS]) == (16.0, 2)
    assert {SCALE, GOOD_STEPS} <= {name for name, _ in tf1.train.list_variables(path)}

    restored = build(make)
    with tf1.Session(graph=restored.graph) as session:
        with restored.graph.as_default():
            tf1.train.Saver().restore(session, path)
        assert_same_values(global_state(session), saved)


@pytest.mark.parametrize("scope", ["", "model"])
def test_the_wrapped_optimizers_variables_are_named_as_in_float32(scope):
    """Adam's beta1_power / beta2_power are created inside the skip cond, where the name
    scope is "cond/" (TF1) or empty (a cond_v2 branch); a checkpoint must not see that."""
    def names(make_optimizer):
        def minimize(optimizer, loss, global_step):
            with tf1.variable_scope(scope or tf1.get_variable_scope()):
                return optimizer.minimize(loss, global_step=global_step)
        graph = build(make_optimizer, minimize=minimize).graph
        return {v.op.name for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}

    float32 = names(adam)
    assert {"beta1_power", "beta2_power"} <= {name.split("/")[-1] for name in float32}
    assert names(wrapped(adam)) == float32 | {SCALE, GOOD_STEPS}


@pytest.mark.parametrize("way", ["minimize", "compute_and_apply", "scaled_loss"])
def test_ops_the_program_builds_after_the_optimizer_keep_their_float32_names(way):
    """A program fetching ``cond/Merge:0`` or ``Identity:0`` by name, or freezing a graph
    by output names, finds the tensors it finds in float32: the loss scaling's own ops take
    no name the program's later ops would have had."""
    def build_program(make_optimizer):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 3], name="x")
            w = tf1.get_variable("w", [3, 2])
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
            optimizer = make_optimizer()
            if way == "minimize":
                optimizer.minimize(loss)
            elif way == "compute_and_apply":
                optimizer.apply_gradients(optimizer.compute_gradients(loss))
            else:
                scaled = (optimizer.get_scaled_loss(loss)
                          if isinstance(optimizer, LossScaleOptimizer) else loss)
                grads = tf.gradients(scaled, [w])
                if isinstance(optimizer, LossScaleOptimizer):
                    grads = optimizer.get_unscaled_gradients(grads)
                optimizer.apply_gradients(zip(grads, [w]))
            branched = tf1.cond(loss > 1.0, lambda: loss * 2.0, lambda: loss + 1.0)
            later = [branched, tf.identity(branched), tf.reduce_sum(w) + 1.0, tf1.Variable(0.0)]
        return {op.name: op.type for op in graph.get_operations()}, [t.op.name for t in later]

    (float32, later), (mixed, _) = build_program(adam), build_program(wrapped(adam))
    assert not [name for name in later if re.search(r"_\d+(/|$)", name)], later
    # The update's own ops ("Adam/...") sit under the wrapped optimizer's name; every other
    # op keeps its name and type.
    missing = {n: t for n, t in float32.items() if mixed.get(n) != t and n.split("/")[0] != "Adam"}
    assert not missing, missing


def test_train_op_collection_holds_the_returned_op_and_the_meta_graph_imports(tmp_path):
    problem = build(wrapped(momentum))
    with problem.graph.as_default():
        assert tf1.get_collection(tf1.GraphKeys.TRAIN_OP) == [problem.train_op]
        path = os.path.join(str(tmp_path), "model.meta")
        tf1.train.export_meta_graph(path)
    with tf.Graph().as_default():
        tf1.train.import_meta_graph(path)
        (train_op,) = tf1.get_collection(tf1.GraphKeys.TRAIN_OP)
        assert train_op.name == problem.train_op.name


# ---- the wrapper: forwarding and wrapping errors -------------------------------------------


def test_attributes_are_forwarded_to_the_wrapped_optimizer():
    problem = build(wrapped(adam))
    optimizer, inner = problem.optimizer, problem.optimizer._optimizer
    inner.custom_hook = lambda: "hooked"
    with problem.graph.as_default():
        w = tf1.global_variables()[0]
        assert optimizer.get_slot(w, "m") is inner.get_slot(w, "m") is not None
        assert set(optimizer.variables()) == set(inner.variables()) | set(
            optimizer.loss_scale.variables())
    assert optimizer._lr == 0.05
    assert optimizer.get_slot_names() == ["m", "v"]
    assert optimizer.custom_hook() == "hooked"
    assert copy.copy(optimizer)._lr == 0.05
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = optimizer.no_such_attribute


def test_learning_rate_of_momentum_is_readable_through_the_wrapper():
    assert LossScaleOptimizer(momentum())._learning_rate == 0.05


class _NamedLike(tf1.train.Optimizer):
    """An optimizer wrapper that stores what it wraps as `attribute`, like Horovod's."""

    def __init__(self, inner, attribute="_optimizer"):
        super().__init__(False, "Wrapper")
        setattr(self, attribute, inner)


def _accumulating_horovod():
    """Like hvd.DistributedOptimizer(opt, backward_passes_per_step=2)."""
    distributed = type("_DistributedOptimizer", (_NamedLike,), {})(momentum())
    distributed._agg_helper = "LocalGradientAggregationHelper"
    return distributed


@pytest.mark.parametrize(
    "make_opt, message",
    [
        pytest.param(lambda: LossScaleOptimizer(momentum()), "wrap an optimizer once",
                     id="wrap_twice"),
        pytest.param(lambda: _NamedLike(LossScaleOptimizer(momentum())), "wrap an optimizer once",
                     id="wrapped_inside_another_wrapper"),
        pytest.param(lambda: tf_loss_scaling().MixedPrecisionLossScaleOptimizer(
            momentum(), 8), "wrap an optimizer once", id="tensorflows_wrapper"),
        pytest.param(lambda: "sgd", "Expected a tf.compat.v1.train.Optimizer", id="not_optimizer"),
        pytest.param(keras_sgd, "tf.keras.mixed_precision.LossScaleOptimizer",
                     id="keras_optimizer"),
        pytest.param(lambda: keras_loss_scale_optimizer(keras_sgd()),
                     "already does loss scaling", id="keras_loss_scale_optimizer"),
        pytest.param(lambda: tf1.train.SyncReplicasOptimizer(momentum(), 1),
                     "Wrap SyncReplicasOptimizer around the LossScaleOptimizer",
                     id="sync_replicas_inside"),
        pytest.param(lambda: type("_DistributedAdasumOptimizer", (_NamedLike,), {})(momentum()),
                     "Adasum", id="horovod_adasum_inside"),
        pytest.param(_accumulating_horovod, "backward_passes_per_step > 1",
                     id="horovod_accumulating_inside"),
    ],
)
def test_wrapping_what_cannot_be_wrapped_says_what_to_do(make_opt, message):
    with tf.Graph().as_default():
        opt = make_opt()
        with pytest.raises(ValueError, match=message):
            LossScaleOptimizer(opt)


def test_none_loss_scale_is_rejected():
    with pytest.raises(ValueError, match="needs a loss scale; got None"):
        LossScaleOptimizer(momentum(), None)


def session_graph_of(graph, monkeypatch):
    """The graph a rewriting session (target cpu) runs for ``graph``."""
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    session = tfamp_rewrite.Session(graph=graph)
    session._shadow.sync()
    session.close()
    return session._shadow.graph


@pytest.mark.parametrize("devices", [("/cpu:0",), ("/cpu:0", "/cpu:1")])
def test_the_user_graph_holds_stock_ops_and_the_session_runs_one_fused_op_per_device(devices, monkeypatch):
    """compute_gradients + apply_gradients unscale and check with stock ops in the user's graph
    (it loads in any TensorFlow); the session's copy has one fused op per gradient device."""
    from tfamp_rewrite import fused_op_available
    from tfamp_rewrite.fused_op.op import OP_TYPE

    assert fused_op_available()  # make test builds the op first
    graph = tf.Graph()
    with graph.as_default():
        losses = []
        for i, device in enumerate(devices * 2):
            with tf.device(device):
                w = tf.compat.v1.get_variable("w%d" % i, [3], initializer=tf.compat.v1.ones_initializer())
                losses.append(tf.reduce_sum(w * w))
        optimizer = LossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        optimizer.minimize(tf.add_n(losses), colocate_gradients_with_ops=True)  # grads on devices
    assert OP_TYPE not in {op.type for op in graph.get_operations()}
    fused = [op for op in session_graph_of(graph, monkeypatch).get_operations() if op.type == OP_TYPE]
    assert sorted(op.device for op in fused) == sorted(
        tf.DeviceSpec.from_string(d).to_string() for d in devices)
    assert sum(len(op.inputs) - 1 for op in fused) == len(devices) * 2


def test_each_gradient_is_read_by_the_fused_op_alone_so_it_is_rewritten_in_place(monkeypatch):
    """TensorFlow lets the op reuse a gradient's buffer only when nothing else reads it: in the
    graph the session runs, the stock ops' readers must be gone (benchmarks/unscale_op.py's
    "as in training")."""
    from tfamp_rewrite import fused_op_available
    from tfamp_rewrite.fused_op.op import OP_TYPE

    assert fused_op_available()  # make test builds the op first
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [4, 8, 8, 3])
        net = tf1.layers.conv2d(images, 8, 3, activation=tf.nn.relu)
        net = tf1.layers.batch_normalization(net, training=True)
        logits = tf1.layers.dense(tf1.layers.flatten(net), 10)
        loss = tf.reduce_mean(tf.square(logits))
        LossScaleOptimizer(momentum(), DynamicLossScale()).minimize(loss)
    (fused,) = [op for op in session_graph_of(graph, monkeypatch).get_operations() if op.type == OP_TYPE]
    gradients = list(fused.inputs)[:-1]
    assert len(gradients) == len(graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)) == 6
    readers = {t.name: [op.name for op in t.consumers()] for t in gradients}
    assert all(names == [fused.name] for names in readers.values()), readers


@pytest.mark.parametrize("version,name", [
    ("1.15.5", "tf.keras.mixed_precision.experimental.LossScaleOptimizer"),
    ("1.15.5+nv", "tf.keras.mixed_precision.experimental.LossScaleOptimizer"),
    ("2.3.4", "tf.keras.mixed_precision.experimental.LossScaleOptimizer"),
    ("2.4.0", "tf.keras.mixed_precision.LossScaleOptimizer"),
    ("2.21.0", "tf.keras.mixed_precision.LossScaleOptimizer"),
])
def test_the_keras_rejection_names_the_running_tensorflows_loss_scale_optimizer(monkeypatch, version, name):
    from tfamp_rewrite.training import keras_compat

    monkeypatch.setattr(keras_compat.tf, "__version__", version)
    with tf.Graph().as_default(), pytest.raises(ValueError) as raised:
        LossScaleOptimizer(keras_sgd())
    assert "use %s, or pass" % name in str(raised.value)


def _tiny_gradient_step(scaled: bool, caplog):
    """One SGD step on ``loss = 1e-8 * sum(x @ w)`` in emulated float16, gradients by tf.gradients.

    dL/d(x @ w) is 1e-8, below float16's smallest subnormal (2**-24 ~ 6e-8): the MatMul of
    the weight gradient reads it as 0 unless the loss was scaled.  Returns w's change
    (the learning rate of 1e6 makes a gradient of 4e-8 a change of 0.04).
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        w = tf1.get_variable("w", initializer=np.ones([4, 4], np.float32))
        loss = 1e-8 * tf.reduce_sum(tf.matmul(x, w))
        opt = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e6), "dynamic")
        if scaled:
            grads = opt.get_unscaled_gradients(tf1.gradients(opt.get_scaled_loss(loss), [w]))
        else:
            grads = tf1.gradients(loss, [w])
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            step = opt.apply_gradients(zip(grads, [w]))
        init = tf1.global_variables_initializer()
    with tfamp_rewrite.Session(graph=graph, numerics="emulate") as session:
        session.run(init)
        session.run(step, {x: np.ones([4, 4], np.float32)})
        return session.run(w) - 1.0


def test_tf_gradients_users_scale_with_get_scaled_loss_and_are_warned_without(monkeypatch, caplog):
    from tfamp_rewrite.training import devices

    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setattr(devices, "_logged", set())  # what this process already said once
    change = _tiny_gradient_step(scaled=True, caplog=caplog)
    np.testing.assert_allclose(change, -0.04, rtol=1e-2)   # the gradient survived float16
    assert not [r for r in caplog.records if "unscaled loss" in r.getMessage()]
    change = _tiny_gradient_step(scaled=False, caplog=caplog)
    assert np.all(change == 0.0)                             # flushed to zero in float16
    (warning,) = [r.getMessage() for r in caplog.records if "unscaled loss" in r.getMessage()]
    assert "get_scaled_loss" in warning and "get_unscaled_gradients" in warning
    assert "with several optimizers, each its own" in warning
    assert "apply_gradients of 'GradientDescent' (GradientDescentOptimizer) got" in warning


def test_each_optimizer_applying_unscaled_gradients_is_named_once(monkeypatch, caplog):
    """An architecture search's child (Momentum) and controller (Adam) both apply
    tf.gradients' results: one line named neither, and said the second one never."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph = tf.Graph()
    with graph.as_default(), caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        w = tf1.get_variable("w", initializer=[1.0, 2.0])
        v = tf1.get_variable("v", initializer=[1.0, 2.0])
        for _ in range(2):  # an Estimator builds its graph again: still once each
            for inner, var in ((tf1.train.MomentumOptimizer(0.1, 0.9), w), (tf1.train.AdamOptimizer(0.1), v)):
                opt = LossScaleOptimizer(inner, "dynamic")
                opt.apply_gradients(zip(tf1.gradients(tf.reduce_sum(var * var), [var]), [var]))
    said = [r.getMessage() for r in caplog.records if "unscaled loss" in r.getMessage()]
    assert [re.search(r"apply_gradients of ('\w+' \(\w+\))", line).group(1) for line in said] == [
        "'Momentum' (MomentumOptimizer)", "'Adam' (AdamOptimizer)"]


def _squared_weights():
    """``(graph, w, loss, opt)``: w = [1, 2], loss = sum(w ** 2), a loss-scaled GradientDescent."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=[1.0, 2.0])
        loss = tf.reduce_sum(tf.square(w))
        opt = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return graph, w, loss, opt


@pytest.mark.parametrize("scaled", [True, False], ids=["compute_gradients", "tf_gradients"])
def test_gradients_accumulated_in_variables_are_judged_by_where_they_came_from(monkeypatch, caplog, scaled):
    """Gradient accumulation: gradients summed into variables over k runs, then applied
    from the variables.  compute_gradients' (from the scaled loss) are not warned about;
    tf.gradients' (from the unscaled loss) still are."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph, w, loss, opt = _squared_weights()
    with graph.as_default():
        grad = opt.compute_gradients(loss, [w])[0][0] if scaled else tf1.gradients(loss, [w])[0]
        accumulator = tf1.get_variable("accumulator", [2], trainable=False,
                                       initializer=tf1.zeros_initializer())
        accumulator.assign_add(grad)
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            opt.apply_gradients([(accumulator / 4.0, w)])
    warnings = [r.getMessage() for r in caplog.records if "unscaled loss" in r.getMessage()]
    assert len(warnings) == (0 if scaled else 1), warnings


@pytest.mark.parametrize("source", ["numpy", "compute_gradients", "tf_gradients"])
def test_fed_gradients_are_warned_about_only_where_the_graph_computes_unscaled_ones(
        monkeypatch, caplog, source):
    """Gradients fed through placeholders (policy-gradient buffers, an evolution strategy's
    estimate) come from no loss in the applying run.  Fed from numpy or from a loss-scaled
    compute_gradients they are fine; where the graph computes tf.gradients of an unscaled
    loss, that is what flushed in float16, and one warning says so."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph, w, loss, opt = _squared_weights()
    with graph.as_default():
        if source == "compute_gradients":
            opt.compute_gradients(loss, [w])
        elif source == "tf_gradients":
            tf1.gradients(loss, [w])
        fed = tf1.placeholder(tf.float32, [2], name="fed_gradient")
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            opt.apply_gradients([(fed, w)])
    said = [r.getMessage() for r in caplog.records if "apply_gradients got gradients" in r.getMessage()]
    if source == "tf_gradients":
        (warning,) = said
        assert "fed from outside the graph" in warning and "('gradients')" in warning
    else:
        assert said == []


CLIPS_IN_BACKPROP = {  # model -> the op the warning names (None: no warning)
    "clipped_in_custom_gradient": "clip_by_value/Minimum", "clipped_in_forward": None,
    "clipped_normalized": None, "clipped_by_global_norm": "clip_by_global_norm/Minimum",
    "clipped_by_average_norm": "clip_by_average_norm/Minimum", "guarded_forward_value": None,
    "guarded_then_clipped": "clip_by_value/Minimum"}


@pytest.mark.parametrize("model", sorted(CLIPS_IN_BACKPROP))
def test_a_gradient_clipped_inside_backprop_is_said_to_see_the_scale(monkeypatch, caplog, model):
    """A custom gradient that clips dy to +-0.1, or by a global or average norm (a bound
    computed from constants: ``1 / clip_norm``), clips the scaled gradient: one warning,
    naming that clip.  A forward clip_by_value, relu6 and a Huber loss differentiate through
    selects: none.  Nor a clip of dy divided by its own maximum, multiplied back (DoReFa's
    gradient quantizer): it bites the same at any scale.  Nor a bound on a forward value in
    a gradient (``dy * x / max(norm, 1e-6)``): it sees no scale."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())

    @tf.custom_gradient
    def clip_gradient(value):
        return tf.identity(value), lambda dy: tf.clip_by_value(dy, -0.1, 0.1)

    @tf.custom_gradient
    def clip_by_norms(value):
        def grad(dy):
            if model == "clipped_by_global_norm":
                return tf.clip_by_global_norm([dy], 1.0)[0][0]
            return tf1.clip_by_average_norm(dy, 1.0)
        return tf.identity(value), grad

    @tf.custom_gradient
    def safe_norm(value):
        norm = tf.sqrt(tf.reduce_sum(tf.square(value), axis=-1, keepdims=True))
        return norm, lambda dy: dy * value / tf.maximum(norm, 1e-6)

    @tf.custom_gradient
    def clip_normalized(value):
        def grad(dy):
            largest = tf.reduce_max(tf.abs(dy), axis=1, keepdims=True)
            return tf.clip_by_value(dy / largest * 0.5 + 0.5, 0.0, 1.0) * largest
        return tf.identity(value), grad

    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 1])
        pred = tf.matmul(x, w)
        if model == "clipped_normalized":
            pred = clip_normalized(pred)
        elif model in ("clipped_by_global_norm", "clipped_by_average_norm"):
            pred = clip_by_norms(pred)
        elif model == "clipped_in_forward":
            pred = tf.nn.relu6(tf.clip_by_value(pred, -5.0, 5.0))
        if model in ("guarded_forward_value", "guarded_then_clipped"):
            pred = safe_norm(tf.concat([pred, pred], 1))
        if model in ("clipped_in_custom_gradient", "guarded_then_clipped"):
            pred = clip_gradient(pred)
        loss = tf1.losses.huber_loss(tf.ones([8, 1]), pred)
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
    said = [r.getMessage() for r in caplog.records if "clips values to constant bounds" in r.getMessage()]
    named = CLIPS_IN_BACKPROP[model]
    assert len(said) == (0 if named is None else 1), said
    if named is not None:
        assert re.search(r"\('gradients/[^']*%s'" % re.escape(named), said[0]), said[0]


@tf.RegisterGradient("TestClipsInNumpy")
def _gradient_clipped_in_numpy(op, dy):
    del op
    clipped = tf1.py_func(lambda value: np.clip(value, -1.0, 1.0), [dy], tf.float32, stateful=False)
    return tf.reshape(clipped, tf.shape(dy))


def test_python_in_the_backprop_computes_on_float32s_gradients(monkeypatch, caplog):
    """DQN's error clipping written in numpy (a gradient_override_map to a py_func): given
    the scaled gradient, np.clip bit at the scale times float32's values, and the update,
    unscaled, shrank by the scale; the model did not learn. It is now given the unscaled
    gradient and its result is scaled back, and that is said once."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())

    def train(make_optimizer):
        graph = tf.Graph()
        with graph.as_default():
            rng = np.random.RandomState(0)
            features = rng.randn(64, 8).astype(np.float32)
            targets = features.dot(np.arange(8, dtype=np.float32))
            w = tf1.get_variable("w", initializer=tf.zeros([8, 1]))
            prediction = tf.squeeze(tf.matmul(tf.constant(features), w), 1)
            with graph.gradient_override_map({"Identity": "TestClipsInNumpy"}):
                error = tf.identity(targets - prediction)
            train_op = make_optimizer().minimize(tf.reduce_sum(0.5 * tf.square(error)))
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                for _ in range(30):
                    session.run(train_op)
                return session.run(w)

    def sgd():
        return tf1.train.GradientDescentOptimizer(0.01)

    float32 = train(sgd)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        scaled = train(lambda: LossScaleOptimizer(sgd(), FixedLossScale(1024.0)))
    assert np.abs(float32).max() > 1.0
    np.testing.assert_allclose(scaled, float32, rtol=1e-4, atol=1e-5)
    (said,) = [r.getMessage() for r in caplog.records if "runs Python" in r.getMessage()]
    assert "'gradients/Identity_grad/PyFuncStateless'" in said


def test_a_float64_variable_is_unscaled_in_float64_and_skipped_with_the_rest():
    """The fused op takes half, float and bfloat16 gradients; a user's float64 variable gets
    its gradient unscaled in float64 and its finite flag joined to the others'."""
    def one_variable_of_each(make_optimizer):
        graph = tf.Graph()
        with graph.as_default():
            overflow = tf1.placeholder_with_default(1.0, [], name="overflow")
            w32 = tf1.get_variable("w32", initializer=[1.0, 2.0])
            w64 = tf1.get_variable("w64", initializer=np.array([1.0 + 2.0 ** -40, 3.0]))
            loss = (tf.reduce_sum(w32 * w32) + tf.cast(tf.reduce_sum(w64 * w64), tf.float32)) * overflow
            train = make_optimizer().minimize(loss)
            init = tf1.global_variables_initializer()
        session = tf1.Session(graph=graph)
        session.run(init)
        return session, train, overflow, (w32, w64)

    plain, plain_train, _, plain_vars = one_variable_of_each(momentum)
    scaled, scaled_train, overflow, scaled_vars = one_variable_of_each(wrapped(momentum))
    with plain, scaled:
        before = scaled.run(scaled_vars)
        scaled.run(scaled_train, {overflow: INF})
        for value, kept in zip(scaled.run(scaled_vars), before):
            np.testing.assert_array_equal(value, kept)         # the step was skipped, w64 too
        plain.run(plain_train)
        scaled.run(scaled_train)
        for value, reference in zip(scaled.run(scaled_vars), plain.run(plain_vars)):
            assert value.dtype == reference.dtype
            np.testing.assert_array_equal(value, reference)    # unscaled exactly (a power of two)


@pytest.mark.parametrize("how", ["minimize", "apply_gradients"])
def test_a_loss_no_variable_reaches_raises_tensorflows_no_gradients_error(how):
    """A py_func loss has no gradient: TensorFlow's optimizer says 'No gradients provided for
    any variable'; the loss-scaled one raised its fused op's 'needs at least one gradient'."""
    graph = tf.Graph()
    with graph.as_default():
        weight = tf1.Variable(1.0)
        loss = tf1.py_func(lambda v: v * v, [weight.read_value()], tf.float32)
        opt = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic")
        with pytest.raises(ValueError, match="No gradients provided for any variable"):
            if how == "minimize":
                opt.minimize(loss)
            else:
                opt.apply_gradients([(None, weight)])


def test_a_cond_applying_every_other_run_keeps_the_scales_update_in_its_branch():
    """Accumulation's cond (apply when a counter says so, as Horovod's backward_passes_per_step
    builds it) does not decide on the gradients: the runs it does not apply are no steps,
    and the scale counts only the applied ones (Horovod's ranks kept identical scales)."""
    def every_other_run(optimizer, loss, global_step):
        grads_and_vars = optimizer.compute_gradients(loss)
        counter = tf1.get_variable("counter", initializer=0, trainable=False)
        with tf.control_dependencies([g for g, _ in grads_and_vars]):
            due = tf.equal(tf1.assign_add(counter, 1) % 2, 0)
        return tf1.cond(due, lambda: optimizer.apply_gradients(grads_and_vars, global_step=global_step),
                        tf.no_op)

    with control_flow_v1():
        problem = build(wrapped(momentum), minimize=every_other_run)
    states = run(problem, [1.0] * 4)
    assert [int(s[GOOD_STEPS]) for s in states] == [0, 1, 1, 2]
    assert [int(s["global_step"]) for s in states] == [0, 1, 1, 2]


def test_a_session_says_the_steps_a_programs_own_guard_skipped(cpu_target_and_fresh_log, caplog):
    """The guarded step's flag is fetched where it is computed, outside the guard's branch:
    the skipped step is said as one, not as a run whose gradients were finite."""
    def guarded(optimizer, loss, global_step):
        grads_and_vars = optimizer.compute_gradients(loss)
        finite = tf1.is_finite(tf1.global_norm([g for g, _ in grads_and_vars]))
        return tf1.cond(finite, lambda: optimizer.apply_gradients(grads_and_vars, global_step=global_step),
                        tf.no_op)

    with control_flow_v1():
        problem = build(wrapped(momentum), minimize=guarded)
        with problem.graph.as_default():
            init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=problem.graph) as session:
        session.run(init)
        session.run(problem.train_op, {problem.overflow: INF})
        session.run(problem.train_op)
    said = [r.getMessage() for r in caplog.records]
    assert any("a training step was skipped" in line for line in said), said
    assert not any("yet its gradients were finite" in line for line in said), said


@pytest.mark.parametrize("loss_of", ["weighted_term", "scaled_sum"])
def test_a_weighted_term_of_a_loss_is_no_loss_scale_of_the_programs(monkeypatch, caplog, loss_of):
    """Deep CORAL's ``cls + 10. * coral`` by tf.gradients: the sum's gradient passes the seed
    to its terms, and the term weighted 10 was taken for the program's own loss scale, so
    the unscaled-loss line was never said.  ``(cls + reg) * 1024.`` is the program's scale."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf1.get_variable("w", [8, 3])
        logits = tf.matmul(x, w)
        cls = tf.reduce_mean(tf.nn.softmax(logits))
        reg = tf.reduce_mean(tf.square(logits))
        loss = cls + 10.0 * reg if loss_of == "weighted_term" else (cls + reg) * 1024.0
        opt = LossScaleOptimizer(tf1.train.MomentumOptimizer(0.01, 0.9), "dynamic")
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            opt.apply_gradients(zip(tf1.gradients(loss, [w]), [w]))
    said = [r.getMessage() for r in caplog.records if "computed from an unscaled loss" in r.getMessage()]
    assert len(said) == (1 if loss_of == "weighted_term" else 0), said


def test_gradients_of_the_programs_own_seeds_are_told_the_loss_that_has_them(monkeypatch, caplog):
    """LambdaRank: tf.gradients(scores, params, grad_ys=lambdas), then apply_gradients.
    There is no loss to hand compute_gradients; the line names the one with those gradients."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", [8, 1])
        scores = tf.matmul(tf.ones([4, 8]), w)
        lambdas = tf.constant([[0.5], [-0.5], [0.25], [-0.25]])
        opt = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic")
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            opt.apply_gradients(zip(tf1.gradients(scores, [w], grad_ys=lambdas), [w]))
    (said,) = [r.getMessage() for r in caplog.records if "apply_gradients of" in r.getMessage()]
    assert "seeds of the program's (grad_ys=...)" in said
    assert "tf.reduce_sum(ys * tf.stop_gradient(grad_ys))" in said

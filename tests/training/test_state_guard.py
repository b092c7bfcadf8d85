"""Writes to non-trainable state keep a skipped step's inf/nan out (state_guard.py).

A float16 overflow in the forward pass makes a step skip, but the run's batch-norm moving
averages were written NaN for good: evaluation returned NaN long after the heal.
"""
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1

import tfamp_rewrite
from tfamp_rewrite.training import devices
from tfamp_rewrite.training.gradient_accumulation import gradient_accumulators
from tfamp_rewrite.training.state_guard import guard_state_writes

tf1 = tf.compat.v1


@pytest.fixture(autouse=True)
def emulated_cpu_amp(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    monkeypatch.setattr(devices, "_logged", set())


WRITE_OPS = ("Assign", "AssignAdd", "AssignVariableOp", "AssignAddVariableOp", "ScatterUpdate",
             "ResourceScatterUpdate", "ScatterSub", "ResourceScatterSub", "StridedSliceAssign",
             "ResourceStridedSliceAssign")


def state_writes_graph(resource):
    """A non-trainable running sum and a shifted queue written from a fed value, a trainable
    weight, a reset and a saver; ``(graph, {what: its write op's name})``."""
    graph = tf.Graph()
    writes = {}

    def named(what, write):
        before = {op.name for op in graph.get_operations()}
        write()
        (writes[what],) = [op.name for op in graph.get_operations()
                           if op.name not in before and op.type in WRITE_OPS]

    with graph.as_default():
        value = tf1.placeholder(tf.float32, [4], name="value")
        total = tf1.get_variable("total", initializer=tf.zeros([4]), trainable=False, use_resource=resource)
        queue = tf1.get_variable("queue", initializer=tf.zeros([8]), trainable=False, use_resource=resource)
        weight = tf1.get_variable("weight", initializer=tf.zeros([4]), use_resource=resource)
        named("add", lambda: tf1.assign_add(total, value))
        named("shift", lambda: tf1.assign(queue, tf.concat([value, queue[:4]], 0)))
        named("weight", lambda: tf1.assign(weight, value))
        named("reset", lambda: tf1.assign(queue, tf.zeros([8])))  # not computed from the queue
        bank = tf1.get_variable("bank", initializer=tf.zeros([3, 4]), trainable=False, use_resource=resource)
        named("scatter", lambda: tf1.scatter_update(bank, [1], value[None]))  # a memory bank's row
        named("scatter_sub", lambda: tf1.scatter_sub(bank, [0], value[None]))  # center loss
        named("slice", lambda: bank[2:3].assign(value[None]))                   # a ring buffer
        tf1.train.Saver([total, queue, bank], name="saver")
    return graph, writes


@pytest.mark.parametrize("resource", [False, True])
def test_writes_to_state_computed_from_it_are_guarded_and_nothing_else(resource):
    graph, writes = state_writes_graph(resource)
    graph_def = graph.as_graph_def()
    guarded = guard_state_writes(graph_def, {"total", "queue", "bank"})
    # The initializers, the restore and the reset would read a variable that may hold nothing.
    assert sorted(guarded) == sorted(writes[w] for w in ("add", "shift", "scatter", "scatter_sub", "slice"))
    graph_def = graph.as_graph_def()
    assert guard_state_writes(graph_def, {"total", "queue"}, leave={writes["add"]}) == [writes["shift"]]


def test_only_writes_computed_through_the_given_nodes_are_guarded():
    """An exponential moving average of float32 weights cannot overflow float16: a write is
    guarded only when its value is computed through a converted node."""
    graph, writes = state_writes_graph(resource=False)
    graph_def = graph.as_graph_def()
    assert guard_state_writes(graph_def, {"total", "queue"}, through={"weight"}) == []
    graph_def = graph.as_graph_def()
    assert sorted(guard_state_writes(graph_def, {"total", "queue"}, through={"value"})) == sorted(
        [writes["add"], writes["shift"]])


@pytest.mark.parametrize("resource", [False, True])
def test_a_guarded_write_keeps_the_entries_it_would_make_not_finite(resource):
    graph, writes = state_writes_graph(resource)
    graph_def = graph.as_graph_def()
    guard_state_writes(graph_def, {"total", "queue", "bank"})
    imported = tf.Graph()
    with imported.as_default():
        tf1.import_graph_def(graph_def, name="")
        values = [imported.get_operation_by_name(name).outputs[0] for name in ("total", "queue", "bank")]
        read = [tf1.raw_ops.ReadVariableOp(resource=v, dtype=tf.float32) if resource else v
                for v in values]
    initializers = [op.name for op in imported.get_operations()
                    if op.name in ("total/Assign", "queue/Assign", "bank/Assign") or
                    (op.type == "AssignVariableOp" and "Initializer" in op.name)]
    with tf1.Session(graph=imported) as session:
        session.run(initializers)
        for what in ("add", "shift", "scatter", "scatter_sub", "slice"):
            session.run(writes[what], {"value:0": [1.0, 2.0, 3.0, 4.0]})
            session.run(writes[what], {"value:0": [np.nan, 1.0, np.inf, 1.0]})
        total, queue, bank = session.run(read)
    np.testing.assert_array_equal(total, [1.0, 3.0, 3.0, 5.0])
    np.testing.assert_array_equal(queue, [1.0, 1.0, 3.0, 1.0, 1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(bank, [[-1.0, -3.0, -3.0, -5.0],   # scatter_sub: finite entries
                                         [1.0, 1.0, 3.0, 1.0],       # scatter_update
                                         [1.0, 1.0, 3.0, 1.0]])      # slice assign


def batch_norm_net(training=True):
    """Conv (weights ~30, inputs up to 255: past float16) -> batch norm (moving averages,
    UPDATE_OPS) -> dense, trained with automatic loss scaling."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [16, 8, 8, 3], name="x")
        y = tf1.placeholder(tf.int64, [16], name="y")
        net = tf1.layers.conv2d(x, 16, 3, padding="same",
                                kernel_initializer=tf1.random_normal_initializer(stddev=30.0))
        if training is not True:  # a placeholder: the moving averages update in a cond
            training = tf1.placeholder_with_default(True, [], name="training")
        net = tf.nn.relu(tf1.layers.batch_normalization(net, training=training))
        logits = tf1.layers.dense(tf1.layers.flatten(net), 4)
        loss = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic")
            train = optimizer.minimize(loss)
        moving = [v for v in tf1.global_variables() if "moving_" in v.name]
        init = tf1.global_variables_initializer()
    feed = {x: (rng.rand(16, 8, 8, 3) * 255).astype(np.float32), y: rng.randint(0, 4, 16)}
    return graph, train, moving, init, feed


@pytest.mark.parametrize("training", [True, "placeholder"])
def test_batch_norm_moving_averages_stay_finite_through_a_heal(caplog, training):
    graph, train, moving, init, feed = batch_norm_net(training)
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(30):
                session.run(train, feed)
            assert session.heals  # the conv overflowed float16, and skipped steps ran the updates
            for value in session.run(moving):
                assert np.isfinite(value).all()
    (said,) = [r.getMessage() for r in caplog.records if "write(s) to non-trainable state" in r.getMessage()]
    assert said.startswith("tfamp_rewrite: 2 write(s) to non-trainable state computed from float16 values")
    assert "e.g. 'batch_normalization/" in said and "AssignMovingAvg" in said
    assert re.search(r"to 'batch_normalization/moving_(mean|variance)'\)", said)  # not a cond's Switch


@pytest.mark.parametrize("resource", [False, True])
def test_a_guarded_write_added_after_the_first_run_is_imported_with_its_guard(caplog, resource):
    """Truncated BPTT builds its state-carry op for validation after training ran: the new
    write's guard was left out of the import, and the run failed on a missing node."""
    graph = tf.Graph()
    with control_flow_v1(), graph.as_default():  # a reference variable's update in a TF1 cond
        tf1.set_random_seed(0)
        x = tf.constant(np.ones((4, 8), np.float32))
        weight = tf1.get_variable("weight", [8, 8], use_resource=resource)
        state = tf1.get_variable("state", initializer=tf.zeros([4, 8]), trainable=False,
                                 use_resource=resource)
        hidden = tf.matmul(x + state, weight)
        loss = tf.reduce_mean(tf.square(hidden))
        train = tf1.train.GradientDescentOptimizer(0.01)
        train = tfamp_rewrite.LossScaleOptimizer(train, "dynamic").minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(train)
        with graph.as_default():
            carry = tf1.assign(state, tf.tanh(hidden), name="carry")
        expected = np.tanh(session.run(hidden))
        session.run(carry)
        np.testing.assert_allclose(session.run(state), expected, rtol=1e-2)
    (said,) = [r.getMessage() for r in caplog.records if "write(s) to non-trainable state" in r.getMessage()]
    assert "e.g. 'carry' to 'state')" in said


def test_batch_norm_moving_averages_restore_from_a_checkpoint(tmp_path):
    """A restore writes the moving averages with no value of theirs to keep: not guarded."""
    graph, train, moving, init, feed = batch_norm_net()
    with graph.as_default():
        saver = tf1.train.Saver()
        assign = [tf1.assign(v, tf.fill(tf.shape(v), 7.0)) for v in moving]
    with tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(assign)
        path = saver.save(session, str(tmp_path / "model"))
    with tfamp_rewrite.Session(graph=graph) as session:
        saver.restore(session, path)
        for value in session.run(moving):
            np.testing.assert_array_equal(value, np.full_like(value, 7.0))


@pytest.mark.parametrize("trainable", [False, True])
def test_gradients_accumulated_over_runs_hand_their_overflow_to_the_step_that_applies_them(
        caplog, trainable):
    """The TF1 accumulation recipe: ``accum.assign_add(g)`` per micro-batch run, then
    ``apply_gradients([(accum / n, w)])`` in a run of its own.  At the first scale the
    gradients overflow float16: kept out of the accumulator, the applying step saw finite
    zeros, never skipped, never lowered the scale, and the weights never moved."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", initializer=tf.zeros([4, 1]))
        loss = tf.reduce_sum(tf.square(tf.linalg.matmul(x, w) - 3.0))  # dloss/dpred * 32768: past 65504
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01), "dynamic")
        accum = tf1.get_variable("accum", initializer=tf.zeros([4, 1]), trainable=trainable)
        zero = accum.assign(tf.zeros_like(accum))
        ((gradient, _),) = opt.compute_gradients(loss, [w])
        add = accum.assign_add(gradient)
        train = opt.apply_gradients([(accum / 2.0 + 1e-4 * w, w)])  # with a weight decay read
        scale = [v for v in tf1.global_variables() if "current_loss_scale" in v.name][0]
        init = tf1.global_variables_initializer()
    # the loss scale and the decayed weight are read by the finite check too, but no write
    # outside the apply branch fills them from a backward pass
    assert gradient_accumulators(graph) == {"accum"}
    xs = np.full((8, 4), 0.25, np.float32)
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(12):
            session.run(zero)
            for _ in range(2):
                session.run(add, {x: xs})
            session.run(train)
        weights, final_scale = session.run([w, scale])
        assert not session.heals  # the loss scale's overflow, not float16's: nothing kept float32
    assert final_scale < 2.0 ** 15 and (weights > 0.5).all()  # 3 skips, then it trains
    said = [r.getMessage() for r in caplog.records]
    assert any("a training step was skipped" in line for line in said)
    for wrong in ("write(s) to non-trainable state", "computed no loss-scaled step",
                  "writes to trainable variable"):
        assert not any(wrong in line for line in said), wrong


@pytest.mark.parametrize("average", ["ema", "assign"])
def test_a_running_average_of_the_gradient_norm_is_guarded_not_taken_for_an_accumulator(caplog, average):
    """Adaptive clipping at twice a running average of the global norm: the clip threshold
    reads the average, which is written from the gradients' norm. A statistic, not an
    accumulator: a skipped step's inf norm stays out of it, as float32 never has one."""
    graph = tf.Graph()
    with control_flow_v1(), graph.as_default():
        rng = np.random.RandomState(0)
        features = rng.rand(256, 32).astype(np.float32)
        labels = (features.sum(1) > 16).astype(np.int32)
        logits = tf1.layers.dense(tf.constant(features), 2, kernel_initializer=tf1.zeros_initializer())
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        global_step = tf1.train.get_or_create_global_step()
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic")
        grads_and_vars = opt.compute_gradients(loss)
        norm = tf1.global_norm([g for g, _ in grads_and_vars])
        if average == "ema":
            ema = tf1.train.ExponentialMovingAverage(0.9)
            update = ema.apply([norm])
            running = ema.average(norm)
        else:
            running = tf1.Variable(0.0, trainable=False, name="avg_norm")
            update = running.assign(0.9 * running + 0.1 * norm)
        clip_to = tf1.cond(global_step < 10, lambda: tf.constant(1e9), lambda: 2.0 * running)
        clipped, _ = tf1.clip_by_global_norm([g for g, _ in grads_and_vars], clip_to, use_norm=norm)
        train = tf.group(opt.apply_gradients(zip(clipped, [v for _, v in grads_and_vars]),
                                             global_step=global_step), update)
        init = tf1.global_variables_initializer()
    assert gradient_accumulators(graph) == set()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(40):
            session.run(train)
        assert np.isfinite(session.run(running)) and session.run(global_step) >= 35
    assert any("write(s) to non-trainable state" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov", "heavy_ball"])
@pytest.mark.parametrize("resource", [False, True])
def test_a_momentum_kept_by_hand_keeps_its_value_on_a_skipped_step(caplog, resource, nesterov):
    """Momentum written by hand, ``m_t = m.assign(0.9 * m + g)``, applied in the same run:
    taken for an accumulator, it stored the first skipped step's inf, and every step after
    it was skipped.  Heavy ball applies ``m_t`` itself: a reference variable's assign gives
    a float32_ref tensor, which the finite check refused."""
    graph = tf.Graph()
    with control_flow_v1(), graph.as_default():
        rng = np.random.RandomState(0)
        features = rng.randn(64, 8).astype(np.float32)
        targets = (features.sum(1, keepdims=True) * 3).astype(np.float32)
        prediction = tf1.layers.dense(tf.constant(features), 1, kernel_initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(prediction - targets))  # its gradients overflow at 32768
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.05), "dynamic")
        global_step = tf1.train.get_or_create_global_step()
        momenta, stepped = [], []
        for grad, var in opt.compute_gradients(loss):
            momentum = tf1.Variable(tf.zeros(var.shape), trainable=False, use_resource=resource)
            momenta.append(momentum)
            updated = momentum.assign(0.9 * momentum + grad)
            stepped.append((grad + 0.9 * updated if nesterov else updated, var))
        train = opt.apply_gradients(stepped, global_step=global_step)
        init = tf1.global_variables_initializer()
    assert gradient_accumulators(graph) == set()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(30):
            session.run(train)
        assert all(np.isfinite(value).all() for value in session.run(momenta))
        assert session.run(global_step) >= 25 and session.run(loss) < 5.0  # from 72

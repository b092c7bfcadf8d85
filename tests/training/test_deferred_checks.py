"""check_numerics waits for the loss scaling in a rewriting session (deferred_checks.py).

A loss-scaled step whose gradients overflow is skipped by design, and TensorFlow's
CheckNumerics would fail that run; a genuine inf/nan still fails it, with TensorFlow's
message, once the session cannot act on it.  tf.add_check_numerics_ops() leaves the skip
cond's ops out where TensorFlow's version refuses the graph.
"""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1
from tensorflow.core.protobuf import config_pb2

import tfamp_rewrite
from tfamp_rewrite.training import activation, devices

tf1 = tf.compat.v1


@pytest.fixture(autouse=True)
def cpu_amp(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setattr(devices, "_logged", set())


def summed_loss_net(check_gradients=False, check_logits=False):
    """x [64, 32] -> dense 64 relu -> dense 1; loss = sum((pred - y)^2): at the initial loss
    scale (2**15) the scaled gradients overflow float16, at a lower one they fit."""
    graph = tf.Graph()
    parts = {"graph": graph}
    with graph.as_default():
        tf1.set_random_seed(0)
        x = parts["x"] = tf1.placeholder(tf.float32, [64, 32], name="x")
        y = tf1.placeholder(tf.float32, [64, 1], name="y")
        hidden = tf1.layers.dense(x, 64, tf.nn.relu, name="hidden")
        pred = tf1.layers.dense(hidden, 1, name="pred")
        if check_logits:
            pred = parts["checked"] = tf.debugging.check_numerics(pred, "pred is not finite")
        parts["loss"] = tf.reduce_sum(tf.square(pred - y))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
        grads_and_vars = opt.compute_gradients(parts["loss"])
        if check_gradients:
            grads_and_vars = [(tf.debugging.check_numerics(g, "bad gradient " + v.op.name), v)
                              for g, v in grads_and_vars]
        parts["global_step"] = tf1.train.get_or_create_global_step()
        parts["train"] = opt.apply_gradients(grads_and_vars, parts["global_step"])
        parts["scale"] = opt.loss_scale()
        parts["init"] = tf1.global_variables_initializer()
    inputs = np.random.default_rng(0).standard_normal([64, 32]).astype(np.float32)
    parts["feed"] = {"x:0": inputs, "y:0": inputs[:, :1] * 10}
    return parts


def said(caplog, words):
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_checked_gradients_of_skipped_steps_do_not_stop_training(caplog):
    parts = summed_loss_net(check_gradients=True)
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        for _ in range(30):
            session.run(parts["train"], parts["feed"])
        steps, scale = session.run([parts["global_step"], parts["scale"]])
    assert scale < 2 ** 15 and 0 < steps < 30  # steps were skipped, then applied
    assert len(said(caplog, "check_numerics (e.g. 'CheckNumerics') wait for the loss scaling")) == 1
    assert len(said(caplog, "a check_numerics saw inf/nan in a step the loss scaling skipped")) == 1


def hidden_layer_gradient_norm(graph):
    """The global norm of summed_loss_net's hidden-layer weight gradients (its backward
    MatMuls), built in ``graph``."""
    return tf1.global_norm([op.outputs[0] for op in graph.get_operations()
                            if op.type == "MatMul" and op.name.startswith("gradients/hidden/")])


def gradient_norm_guarded_net(bound):
    """summed_loss_net's step under an exploding-gradient guard, written in TF1 control flow
    as TF1 programs ran it: ``assert_less(global_norm(grads), bound)`` (TensorFlow's guarded
    Assert, its data a float) and ``Assert(all finite, [a string])`` (an unguarded one)."""
    with control_flow_v1():
        parts = summed_loss_net()
        graph = parts["graph"]
        with graph.as_default():
            norm = parts["norm"] = hidden_layer_gradient_norm(graph)
            bounded = parts["bounded"] = tf1.debugging.assert_less(norm, bound, message="exploding gradients")
            finite = parts["finite"] = tf1.Assert(tf.reduce_all(tf.math.is_finite(norm)),
                                                  ["gradients are not finite"], name="all_finite")
            parts["guarded_train"] = tf.group(parts["train"], bounded, finite)
    return parts


@pytest.mark.parametrize("session_class", [tf1.Session, tfamp_rewrite.Session])
def test_assertions_on_gradients_wait_for_skipped_steps(caplog, session_class):
    """Under loss scaling the first steps' scaled gradients overflow float16 and are skipped:
    an exploding-gradient guard on them failed the run, which float32 never does."""
    parts = gradient_norm_guarded_net(bound=1e12)
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), \
            session_class(graph=parts["graph"]) as session:
        session.run(parts["init"])
        for _ in range(30):
            session.run(parts["guarded_train"], parts["feed"])
        steps = session.run(parts["global_step"])
    if session_class is tf1.Session:
        assert steps == 30
        return
    assert 0 < steps < 30  # steps were skipped, then applied
    assert len(said(caplog, "2 assertion(s) (e.g. 'all_finite/Assert') wait for the loss scaling")) == 1
    assert len(said(caplog, "an assertion ('assert_less/Assert/AssertGuard/Assert') failed in a "
                            "step the loss scaling skipped")) == 1


def test_an_assertion_failing_in_float32_too_fails_with_tensorflows_message():
    """A bound the gradients exceed in float32 too: once steps apply, the guard fails the run
    as TensorFlow's does -- its message with the values, the user's node, where it was made."""
    parts = gradient_norm_guarded_net(bound=1e-3)
    with tf1.Session(graph=parts["graph"]) as session, \
            pytest.raises(tf.errors.InvalidArgumentError) as float32:
        session.run(parts["init"])
        session.run(parts["guarded_train"], parts["feed"])
    with tfamp_rewrite.Session(graph=parts["graph"]) as session, \
            pytest.raises(tf.errors.InvalidArgumentError) as amp:
        session.run(parts["init"])
        for _ in range(30):
            session.run(parts["guarded_train"], parts["feed"])
    expected = ("[exploding gradients] [Condition x < y did not hold element-wise:] "
                "[x (global_norm/global_norm:0) = ] [")
    for raised in (float32, amp):
        assert ("assertion failed: " + expected) in raised.value.message
        assert raised.value.op.name == "assert_less/Assert/AssertGuard/Assert"
        assert "test_deferred_checks.py" in raised.value.message
    assert amp.value.op is parts["graph"].get_operation_by_name("assert_less/Assert/AssertGuard/Assert")
    shown = float(amp.value.message.split(expected)[1].split("]")[0])
    assert np.isfinite(shown) and shown > 1e-3  # the norm of an applied step's gradients


def test_an_assertion_on_shapes_alone_stays_tensorflows():
    """An assertion no float value reaches fails where float32's does: it is not deferred."""
    with control_flow_v1():
        parts = summed_loss_net()
        with parts["graph"].as_default():
            expected = tf1.placeholder(tf.int32, [], name="expected_batch")
            batch = tf1.debugging.assert_equal(tf.shape(parts["x"])[0], expected, message="batch size")
            train = tf.group(parts["train"], batch)
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        session.run(train, dict(parts["feed"], **{"expected_batch:0": 64}))
        assert session._shadow.deferred_checks == set()
        with pytest.raises(tf.errors.InvalidArgumentError, match="batch size"):
            session.run(train, dict(parts["feed"], **{"expected_batch:0": 8}))


def test_the_shape_check_of_a_loss_on_half_logits_stays_tensorflows(caplog):
    """``sparse_softmax_cross_entropy_with_logits`` of dynamically shaped logits asserts the
    labels' shape against theirs: a Shape of a half tensor is converted too, and the check
    was deferred as a guard on values, said as one, and mismatched labels then failed in
    another node with another message."""
    graph = tf.Graph()
    with control_flow_v1(), graph.as_default():
        tokens = tf1.placeholder(tf.int32, [None, None], name="tokens")
        labels = tf1.placeholder(tf.int32, [None, None], name="labels")
        w = tf1.get_variable("w", [8, 10])
        logits = tf.reshape(tf.matmul(tf.reshape(tf.one_hot(tokens, 8), [-1, 8]), w),
                            tf.concat([tf.shape(tokens), [10]], 0))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic")
        train = optimizer.minimize(loss)
        init = tf1.global_variables_initializer()
    batch = np.random.RandomState(0).randint(0, 8, (4, 6))
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run([loss, train], {tokens: batch, labels: batch})
        assert session._shadow.deferred_checks == set()
        with pytest.raises(tf.errors.InvalidArgumentError, match="Condition x == y") as raised:
            session.run([loss, train], {tokens: batch, labels: batch[:, :5]})
    assert raised.value.op.type == "Assert"
    assert not [r for r in caplog.records if "assertion" in r.getMessage()]


def test_a_sequence_length_check_failing_twice_heals_nothing(caplog):
    """``dynamic_rnn``'s check of a fed ``sequence_length`` against the input's shape, where a
    dense layer's half output is the input: it failed twice, was blamed on float16, and the
    dense MatMul was 'healed' for good (and written beside the checkpoints)."""
    graph = tf.Graph()
    with control_flow_v1(), graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 20, 8], name="x")
        lengths = tf1.placeholder(tf.int32, [None], name="lengths")
        hidden = tf1.layers.dense(x, 16)
        _, state = tf1.nn.dynamic_rnn(tf1.nn.rnn_cell.GRUCell(8), hidden, sequence_length=lengths,
                                      dtype=tf.float32)
        loss = tf.reduce_sum(tf.square(state))
        train = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic").minimize(loss)
        init = tf1.global_variables_initializer()
    batch = np.random.RandomState(0).randn(8, 20, 8).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for size in (7, 8, 7):
            try:
                session.run(train, {x: batch, lengths: np.full(size, 20, np.int32)})
            except tf.errors.InvalidArgumentError:
                assert size == 7
        assert session.heals == []
    said = [r.getMessage() for r in caplog.records if r.name == "tfamp_rewrite"]
    assert not [line for line in said if "assertion" in line or "the check" in line], said


def test_a_genuine_nan_fails_the_run_with_tensorflows_message_once_the_session_cannot_act():
    parts = summed_loss_net(check_logits=True)
    feed = dict(parts["feed"])
    feed["x:0"] = feed["x:0"].copy()
    feed["x:0"][3, 5] = np.nan  # NaN in float32 too: nothing to heal
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            for _ in range(40):
                session.run(parts["train"], feed)
        assert session.run(parts["global_step"]) == 0
    assert "pred is not finite : Tensor had NaN values" in raised.value.message
    assert "test_deferred_checks.py" in raised.value.message  # where the check was made, as TF says
    assert raised.value.op is parts["checked"].op  # the user's node, not the private graph's
    assert raised.value.node_def.name == parts["checked"].op.name


def test_a_write_computed_from_a_check_writes_nothing_where_the_check_fails(caplog):
    """A running mean updated from a checked batch mean: float32's failing check stopped the
    run before the assignment, and the program dropped the batch.  Deferred, the check let
    the assignment store NaN for good; held by the check, it keeps float32's value."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 2], name="x")
        running_mean = tf1.Variable(tf.zeros([2]), trainable=False, name="running_mean")
        batch_mean = tf.debugging.check_numerics(tf.reduce_mean(x, 0), "batch mean")
        update = tf1.assign(running_mean, 0.9 * running_mean + 0.1 * batch_mean, name="update_mean")
        loss = tf.reduce_mean(tf.square(tf1.layers.dense(x - running_mean, 1)))
        with tf.control_dependencies([update]):
            train = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01),
                                                     "dynamic").minimize(loss)
        init = tf1.global_variables_initializer()

    def means(session_class):
        with session_class(graph=graph) as session:
            session.run(init)
            for bad in (False, False, True, False):
                batch = np.ones((4, 2), np.float32)
                batch[0, 0] = np.nan if bad else 1.0
                try:
                    session.run(train, {x: batch})
                except tf.errors.InvalidArgumentError:
                    pass  # float32: the check fails the run; the program drops the batch
            return session.run(running_mean)

    expected = means(tf1.Session)
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        got = means(tfamp_rewrite.Session)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert len(said(caplog, "in a run where a check_numerics or an assertion fails, the 1 write(s) "
                            "computed from it (e.g. 'update_mean') write nothing")) == 1


@pytest.mark.parametrize("how", ["run", "callable"])
def test_a_run_computing_no_step_fails_at_once(how):
    parts = summed_loss_net(check_logits=True)
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        if how == "run":
            def evaluate(x):
                return session.run(parts["checked"], {"x:0": x})
        else:  # Keras' way in graph mode
            evaluate = session._make_callable_from_options(
                config_pb2.CallableOptions(feed=["x:0"], fetch=[parts["checked"].name]))
        good = parts["feed"]["x:0"]
        bad = good.copy()
        bad[0, 0] = np.nan
        assert np.isfinite(evaluate(good)).all()
        with pytest.raises(tf.errors.InvalidArgumentError, match="pred is not finite : Tensor had NaN"):
            evaluate(bad)


def test_of_the_checks_that_fail_the_first_made_is_named_as_tensorflows_chain_does():
    """add_check_numerics_ops finds where an inf starts: the first failing check of its chain,
    made in the graph's order.  The deferred checks named the failing check whose name
    sorts first ('CheckNumerics_10', downstream, before 'CheckNumerics_4')."""
    graph = tf.Graph()
    with control_flow_v1(), graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        hidden = tf1.layers.dense(x, 4)
        probabilities = tf.nn.softmax(hidden)
        log_p = tf1.log(probabilities - probabilities, name="logp")  # -inf: where it starts
        downstream = log_p * 0.0
        for layer in range(12):
            downstream = tf.add(downstream, 1.0, name="layer%d" % layer)
        loss = tf.reduce_mean(downstream) + tf.reduce_mean(tf.square(hidden))
        tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic").minimize(loss)
        activation.enable_graph_rewrite()
        try:
            check_all = tf1.add_check_numerics_ops()
        finally:
            activation.deactivate()
        init = tf1.global_variables_initializer()
    feed = {x: np.ones((2, 4), np.float32)}
    with tf1.Session(graph=graph) as session, pytest.raises(tf.errors.InvalidArgumentError) as float32:
        session.run(init)
        session.run([loss, check_all], feed)
    with tfamp_rewrite.Session(graph=graph) as session, pytest.raises(tf.errors.InvalidArgumentError) as amp:
        session.run(init)
        session.run([loss, check_all], feed)  # an evaluation: no step to wait for
    assert "logp:0 : Tensor had Inf values" in float32.value.message
    assert "logp:0 : Tensor had Inf values" in amp.value.message


def test_add_check_numerics_ops_leaves_the_skip_cond_out_and_training_runs(caplog):
    with control_flow_v1():
        parts = summed_loss_net()
        activation.enable_graph_rewrite()
        try:
            with parts["graph"].as_default():
                check_all = tf1.add_check_numerics_ops()
        finally:
            activation.deactivate()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        for _ in range(30):
            session.run([parts["train"], check_all], parts["feed"])
        assert 0 < session.run(parts["global_step"]) < 30
    (line,) = said(caplog, "tf.add_check_numerics_ops() leaves out")
    assert "of the loss scaling's skip cond (e.g. 'amp_loss_scaling" in line


def test_a_partial_run_says_its_checks_are_not_evaluated_once(caplog):
    """A partial run cannot fetch the checks' statuses: said once, in a sentence that agrees."""
    parts = summed_loss_net(check_gradients=True)
    with parts["graph"].as_default():
        checked = [op.outputs[0] for op in parts["graph"].get_operations() if op.type == "CheckNumerics"]
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        for _ in range(2):
            handle = session.partial_run_setup(checked, ["x:0", "y:0"])
            session.partial_run(handle, checked, parts["feed"])
    (line,) = said(caplog, "not evaluated in partial runs")
    assert "and 1 more are not evaluated" in line and "their statuses cannot be fetched" in line


def test_an_evaluations_deferred_assertion_failing_below_half_nodes_is_said(caplog):
    """tf.metrics.auc checks its predictions lie in [0, 1]: in a graph that also trains, the
    check is deferred, and an evaluation whose half logits overflowed still fails the run
    with TensorFlow's error, said as where it is not deferred."""
    with control_flow_v1():
        parts = summed_loss_net()
        with parts["graph"].as_default():
            logits = tf.matmul(parts["x"], tf.ones([32, 1]), name="logits")
            predictions = tf.sigmoid(logits - tf1.reduce_max(logits))  # inf - inf: NaN in float16
            _, update = tf1.metrics.auc(tf.ones([64, 1]), predictions)
            local_init = tf1.local_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run([parts["init"], local_init])
        with pytest.raises(tf.errors.InvalidArgumentError, match="predictions must be in"):
            session.run(update, {"x:0": np.full([64, 32], 2.0 ** 11, np.float32)})  # 2**16: inf
    assert len(said(caplog, "assertion(s) (e.g. 'auc/assert_")) == 1  # deferred
    (line,) = said(caplog, "nodes lie upstream of")
    assert re.search(r"failed in the assertion 'auc/assert_(less|greater)_equal/Assert/", line)


def test_a_guard_failing_on_finite_values_stops_the_update_and_fails_every_run():
    """An exploding-gradient guard before apply_gradients, failing on a finite norm: float32
    raises at every run and never updates. Deferred, the update was applied, then raised."""
    with control_flow_v1():
        parts = summed_loss_net()
        graph = parts["graph"]
        with graph.as_default():
            norm = hidden_layer_gradient_norm(graph)
            guard = tf1.debugging.assert_less(norm, 1e-3, message="exploding gradients")
            weights = [v for v in tf1.trainable_variables() if "kernel" in v.name]
            opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
            gvs = opt.compute_gradients(parts["loss"])
            with tf.control_dependencies([guard]):
                guarded = opt.apply_gradients(gvs)
    with tfamp_rewrite.Session(graph=graph) as session:
        session.run(parts["init"])
        session.run(tf1.variables_initializer(opt.variables()))
        before = session.run(weights)
        raised = 0
        for _ in range(30):
            try:
                session.run(guarded, parts["feed"])
            except tf.errors.InvalidArgumentError as error:
                assert "exploding gradients" in error.message
                raised += 1
        after = session.run(weights)
    assert raised > 10  # once steps would apply, every run fails, as float32's did
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)


@pytest.mark.parametrize("data", ["string", "values"])
def test_an_assertion_on_fed_values_alone_is_tensorflows(data):
    """A guard on the fed batch's finiteness: no skipped step or half node makes a NaN
    there, so it fails every bad batch as float32's does, not only the unskipped ones."""
    with control_flow_v1():
        parts = summed_loss_net()
        graph = parts["graph"]
        with graph.as_default():
            finite = tf.reduce_all(tf.math.is_finite(parts["x"]))
            shown = ["bad batch"] if data == "string" else ["bad batch", parts["x"]]
            train = tf.group(parts["train"], tf1.Assert(finite, shown, name="batch_finite"))
    bad = dict(parts["feed"])
    bad["x:0"] = bad["x:0"].copy()
    bad["x:0"][0, 0] = np.nan
    with tfamp_rewrite.Session(graph=graph) as session:
        session.run(parts["init"])
        for _ in range(3):
            with pytest.raises(tf.errors.InvalidArgumentError, match="bad batch"):
                session.run(train, bad)
        assert "batch_finite/Assert" not in session._shadow.deferred_checks


def test_an_assertion_message_keeps_a_matrix_on_the_line_of_its_failure():
    """The values of a failing deferred assertion came numpy-style, a matrix's rows on lines
    of their own: the first line of the message no longer held them, as TensorFlow's does."""
    from tfamp_rewrite.training.assertion_deferral import SEPARATOR, failure_message

    formatted = SEPARATOR.join(['"pred:"', "[[0.5 1 1.5]\n [2 2.5 3.25]]", "inf", '"two\nlines"']).encode()
    assert failure_message(formatted) == ("assertion failed: [pred:] [[0.5 1 1.5] [2 2.5 3.25]] [inf] "
                                          "[two\nlines]")  # a string of the user's is left as it is

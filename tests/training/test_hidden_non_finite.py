"""Inf/nan that an inference run's fetched values cannot show (hidden_non_finite.py).

A classifier whose float16 logits overflow returns ordinary-looking predictions (argmax of
inf) and a finite accuracy: the session must say so, once, and change nothing it returns.
"""
import contextlib
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from graph_runner import plain_config
from model_graphs import control_flow_v1
from tensorflow.core.protobuf import config_pb2

from tfamp_rewrite import LossScaleOptimizer
from tfamp_rewrite.graph_rewrite.control_flow import control_flow_of, tf_graph_inputs
from tfamp_rewrite.training.session import Session

tf1 = tf.compat.v1
# Logits 4x * [1, 2, 3]: x = 2**13 overflows float16 in two of them (argmax 1, not 2).
OVERFLOWING = np.full([2, 4], 2.0 ** 13, np.float32)
ORDINARY = np.full([2, 4], 1.0, np.float32)
LABELS = np.array([2, 2])
HIDDEN_LINE = "computed inf/nan in 'logits:0', read by 'predictions' (ArgMax)"


pytestmark = pytest.mark.usefixtures("cpu_target_and_fresh_log")


def classifier_graph():
    """``predictions = argmax(x @ w)`` and ``accuracy`` against ``labels``: no float fetch
    shows an overflow of the MatMul."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        logits = tf.matmul(x, tf.constant(np.tile([[1.0, 2.0, 3.0]], [4, 1]), tf.float32),
                           name="logits")
        predictions = tf.argmax(logits, 1, name="predictions")
        tf.reduce_mean(tf.cast(tf.equal(predictions, labels), tf.float32), name="accuracy")
    return graph


def ours(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "tfamp_rewrite"]


def hidden_lines(caplog):
    return [r.getMessage() for r in caplog.records if "do not show it" in r.getMessage()]


def test_an_overflow_hidden_by_argmax_is_said_once_and_changes_nothing(caplog):
    graph = classifier_graph()
    fetches = ["predictions:0", "accuracy:0"]
    with tf1.Session(graph=graph, config=plain_config()) as plain:
        expected = plain.run(fetches, {"x:0": ORDINARY, "labels:0": LABELS})
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        ordinary = session.run(fetches, {"x:0": ORDINARY, "labels:0": LABELS})
        assert not hidden_lines(caplog)
        overflowed = [session.run(fetches, {"x:0": OVERFLOWING, "labels:0": LABELS})
                      for _ in range(3)]  # the second run of a kind is not checked
        assert session._inference.hidden_fetches(
            [session._shadow.private_fetch(f) for f in fetches], []) is None  # said: no more checks
    np.testing.assert_array_equal(ordinary[0], expected[0])
    assert ordinary[1] == expected[1] == 1.0
    for predictions, accuracy in overflowed:  # float32 says 2 and 1.0
        np.testing.assert_array_equal(predictions, [1, 1])
        assert accuracy == 0.0
    (line,) = hidden_lines(caplog)
    assert HIDDEN_LINE in line and "computed no loss-scaled step" in line
    assert "they are finite and wrong" in line  # predictions [1, 1] where float32 says 2
    assert "returned inf/nan" not in caplog.text


@pytest.mark.parametrize("resource", [False, True])
def test_an_overflow_a_hand_written_update_stores_is_said_and_healed(caplog, resource):
    """EM's M-step stores a second moment with tf.assign, fetched only as an op: its half
    MatMul overflowed, the variable held inf for good, and nothing was said."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        weights = tf1.placeholder(tf.float32, [None, 2], name="weights")
        moment = tf1.get_variable("moment", initializer=tf.ones([2, 4]), use_resource=resource)
        second = tf.matmul(weights, tf.square(x), transpose_a=True, name="second_moment")
        store = tf1.assign(moment, second / 1000.0, name="store")
        init = tf1.global_variables_initializer()
    feed = {"x:0": np.full([1000, 4], 100.0, np.float32), "weights:0": np.full([1000, 2], 0.5, np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for _ in range(4):
            session.run(store.op, feed)
        stored = session.run(moment)
        assert session.heals and session.heals[0].nodes == ["second_moment"]
    np.testing.assert_allclose(stored, np.full([2, 4], 5000.0))  # float32's, once healed
    (line,) = hidden_lines(caplog)
    assert "computed inf/nan in 'truediv:0', read by 'store' (" in line


def test_later_runs_reading_a_variable_an_overflow_was_stored_in_are_told_where_it_came_from(caplog):
    """EM by hand: the M-step's half MatMul overflowed into the variance variable, and every
    later run's log-likelihood is NaN from float32's 1 / var -- which was said to show that
    mixed precision did not cause it."""
    data = np.random.RandomState(0).normal(60.0, 10.0, [2000, 3]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        variance = tf1.Variable(np.tile(data.var(0), (2, 1)), name="variance")
        log_p = (-0.5 * tf.matmul(tf.square(x), 1.0 / variance, transpose_b=True, name="e_step")
                 - 0.5 * tf.reduce_sum(tf1.log(variance), 1))
        responsibilities = tf.nn.softmax(log_p)
        log_likelihood = tf.reduce_mean(tf.reduce_logsumexp(log_p, 1))
        moment = tf.matmul(responsibilities, tf.square(x), transpose_a=True, name="m_step")
        m_step = tf.group(tf1.assign(variance, moment / tf.reduce_sum(responsibilities, 0)[:, None],
                                     name="store"))
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for _ in range(12):
            session.run([log_likelihood, m_step], {"x:0": data})
    lines = ours(caplog)
    assert "mixed precision did not cause it" not in caplog.text
    (stored,) = [line for line in lines if "starts in variable 'variance'" in line]
    assert "the write 'store' of the run said above stored float16's inf/nan in variable 'variance'" in stored
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^e_step$,^m_step$'" in stored
    assert lines[-1] == stored  # nothing more is watched: every later run reads it


def test_an_overflow_stored_in_one_variable_and_passed_to_another_is_traced_to_its_write(caplog):
    """EM by hand: the M-step's overflow went into the means, the variances were written
    from the means, and the later runs' NaN started in a float32 value of the variances --
    said to show that mixed precision did not cause it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        means = tf1.Variable(tf.ones([4, 4]), name="means")
        spread = tf1.Variable(tf.ones([4, 4]), name="spread")
        store = tf1.assign(means, tf.matmul(x, x, transpose_a=True, name="moments") / 1000.0, name="store")
        pass_on = tf1.assign(spread, means * 2.0, name="pass_on")
        score = tf.reduce_mean(spread - spread, name="score")  # inf - inf: NaN in float32
    feed = {"x:0": np.full([1000, 4], 100.0, np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run([means.initializer, spread.initializer])
        session.run(store.op, feed)
        for _ in range(12):
            session.run([pass_on.op, score])
    assert "mixed precision did not cause it" not in caplog.text
    (stored,) = [line for line in ours(caplog) if "of the run said above stored" in line]
    assert "starts in the float32 value 'score:0', computed from the program's variables" in stored
    assert "stored float16's inf/nan in variable 'means'" in stored and "'^moments$'" in stored


def test_a_value_a_setup_run_stored_is_traced_from_the_runs_reading_it(caplog):
    """A covariance stored once, then read by power iteration: the search looked only at
    runs computing the write, which none did, and ended having found nothing."""
    data = np.random.RandomState(0).normal(0.0, 10.0, [2000, 8]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        covariance = tf1.Variable(tf.zeros([8, 8]), trainable=False, name="covariance")
        setup = tf1.assign(covariance, tf.matmul(x, x, transpose_a=True, name="gram") / 2000.0, name="setup")
        vector = tf1.Variable(tf.ones([8, 1]) / np.sqrt(8.0), name="vector")
        product = tf.matmul(covariance, vector, name="product")
        power_step = tf1.assign(vector, product / tf.norm(product), name="power_step")
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        session.run(setup, {"x:0": data})
        for _ in range(20):
            session.run(power_step.op)
    (stored,) = [line for line in ours(caplog) if "starts in variable" in line]
    assert "starts in variable 'covariance'" in stored and "the write 'setup'" in stored
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^gram$'" in stored
    assert "mixed precision did not cause it" not in caplog.text


def test_a_heal_names_the_variables_the_runs_before_it_wrote_from_the_inf(caplog, monkeypatch):
    """k-means: the half distance MatMul overflows, ArgMin picks wrong centroids, and the
    runs before the heal assigned centroids from them -- unsaid."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    rng = np.random.RandomState(0)
    points = np.concatenate([rng.normal(m, 8, [500, 3]) for m in (40, 120, 200, 240)]).clip(0, 255)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(points.astype(np.float32))
        centroids = tf1.Variable(points[:4].astype(np.float32), name="centroids")
        distances = (tf.reduce_sum(x * x, 1, keepdims=True) - 2 * tf.matmul(x, centroids, transpose_b=True)
                     + tf.reduce_sum(centroids * centroids, 1))
        nearest = tf.argmin(distances, 1)
        sums = tf1.unsorted_segment_sum(x, nearest, 4)
        counts = tf1.unsorted_segment_sum(tf.ones([2000, 1]), nearest, 4)
        update = tf1.assign(centroids, tf1.where(counts[:, 0] > 0, sums / tf.maximum(counts, 1.0), centroids))
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for _ in range(6):
            session.run(update.op)
        assert session.heals
    (healed,) = [line for line in ours(caplog) if line.startswith("tfamp_rewrite: healed:")]
    assert "the runs before it wrote values computed from it into variable 'centroids'" in healed


@pytest.mark.parametrize("flow", ["tf1", "tf2"])
def test_a_heal_names_no_optimizer_state_the_healed_values_did_not_compute(caplog, monkeypatch, flow):
    """A forward MatMul overflowing behind a Huber loss, trained by Adam: its update of
    beta1_power waits on the weights' updates (a control edge) in the skip cond the
    gradients decide, but is not computed from the healed values."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph = tf.Graph()
    with graph.as_default(), (control_flow_v1() if flow == "tf1" else contextlib.nullcontext()):
        x = tf1.placeholder(tf.float32, [None, 16])
        w = tf1.get_variable("w", [16, 1], initializer=tf1.constant_initializer(4000.0))
        prediction = tf.squeeze(tf.matmul(x, w, name="out"), 1)
        loss = tf1.losses.huber_loss(tf.zeros_like(prediction), prediction, delta=1.0)
        train = tf1.train.AdamOptimizer(1e-3).minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for _ in range(6):
            session.run([loss, train], {x: np.full((8, 16), 1.5, np.float32)})
        assert session.heals
    (healed,) = [line for line in ours(caplog) if line.startswith("tfamp_rewrite: healed:")]
    assert "'out'" in healed and "beta1_power" not in healed and "wrote values" not in healed


def test_after_its_first_runs_a_session_checks_one_run_in_sixteen(caplog):
    from tfamp_rewrite.training import inference_watch

    every, then = inference_watch.CHECK_EVERY_RUN, inference_watch.CHECK_THEN
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            Session(graph=classifier_graph()) as session:
        for _ in range(every):
            session.run("predictions:0", {"x:0": ORDINARY})
        runs = every
        while not hidden_lines(caplog):
            session.run("predictions:0", {"x:0": OVERFLOWING})
            runs += 1
    assert runs == every + then - every % then


def test_each_kind_of_run_goes_unchecked_on_its_second_run_not_first_after_many(caplog):
    """The first run without the checks is a new kind of run, which TensorFlow prepares anew:
    at run 65 that was a pause of seconds mid-training (a graph holding its dataset as a
    constant).  Each kind's second run goes without them instead, at start-up."""
    from tfamp_rewrite.training import inference_watch

    every, then = inference_watch.CHECK_EVERY_RUN, inference_watch.CHECK_THEN
    with Session(graph=classifier_graph()) as session:
        checked, due = [], session._inference.check_due

        def recorded(kind=None):
            checked.append(due(kind))
            return checked[-1]

        session._inference.check_due = recorded
        for _ in range(every + then):
            session.run("predictions:0", {"x:0": ORDINARY})
    assert checked[:3] == [True, False, True] and all(checked[2:every])
    assert checked[every:every + then] == [False] * (then - 1) + [True]


def test_a_callable_from_options_is_checked_too(caplog):
    """Keras' way to predict in TF1 graph mode; its second run is not checked (above)."""
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            Session(graph=classifier_graph()) as session:
        predict = session._make_callable_from_options(
            config_pb2.CallableOptions(feed=["x:0"], fetch=["predictions:0"]))
        np.testing.assert_array_equal(predict(ORDINARY)[0], [2, 2])
        np.testing.assert_array_equal(predict(OVERFLOWING)[0], [1, 1])
        assert not hidden_lines(caplog)
        np.testing.assert_array_equal(predict(OVERFLOWING)[0], [1, 1])
    assert HIDDEN_LINE in hidden_lines(caplog)[0]


@pytest.mark.parametrize("decoder", ["greedy", "beam"])
def test_a_ctc_decoder_of_overflowed_logits_is_said(caplog, decoder):
    """A CTC decoder turns NaN logits into an ordinary-looking transcript."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [5, 1, 4], name="x")  # time-major
        logits = tf.matmul(tf.reshape(x, [5, 4]), tf.ones([4, 3]), name="logits")
        logits = tf.reshape(logits - tf.reduce_mean(logits), [5, 1, 3], name="time_major")
        decode = (tf.nn.ctc_greedy_decoder if decoder == "greedy" else tf.nn.ctc_beam_search_decoder)
        (decoded,), _ = decode(logits, [5])
        tf.identity(decoded.values, name="labels")
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run("labels:0", {"x:0": np.full([5, 1, 4], 1.0, np.float32)})
        assert not hidden_lines(caplog)
        for _ in range(2):  # the second run of a kind is not checked
            session.run("labels:0", {"x:0": np.full([5, 1, 4], 2.0 ** 14, np.float32)})
    (line,) = hidden_lines(caplog)
    assert "'time_major:0', read by" in line and "CTC" in line


def test_an_assertion_failing_below_half_nodes_is_said(caplog):
    """tf.metrics.auc checks its predictions lie in [0, 1]: NaN ones fail the run, and the
    fetches can no longer be looked at. TensorFlow's own error is raised unchanged."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        labels = tf1.placeholder(tf.float32, [None, 1], name="labels")
        logits = tf.matmul(x, tf.ones([4, 1]), name="logits")
        predictions = tf.sigmoid(logits - tf.reduce_max(logits))  # inf - inf: NaN in float16
        _, update = tf1.metrics.auc(labels, predictions)
        init = tf1.local_variables_initializer()
    feed = {"labels:0": np.ones([2, 1], np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        session.run(update, dict(feed, **{"x:0": ORDINARY}))
        assert not ours(caplog)
        with pytest.raises(tf.errors.InvalidArgumentError, match="predictions must be in"):
            session.run(update, dict(feed, **{"x:0": OVERFLOWING * 2}))  # 4 x 2**14: inf
    line, closed = ours(caplog)  # then the session closed before its search could look
    assert "a session closed while looking for where the inf/nan said above starts" in closed
    assert re.search(r"failed in the assertion 'auc/assert_(less|greater)_equal/Assert/", line) or (
        "failed in an assertion (assertion failed: [predictions must be in [0, 1]]" in line)
    assert "If float32 passes it, a float16 value overflowed" in line
    assert "rounded beyond the assertion's tolerance" in line  # an assertion may fail on rounding


def test_a_decomposition_failing_on_a_matrix_half_nodes_computed_names_them(caplog):
    """ZCA whitening: the batch covariance overflows its half MatMul and the eigen
    decomposition fails the run -- with TensorFlow's error alone, and nothing to act on."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        centered = x - tf.reduce_mean(x, 0)
        covariance = tf.matmul(centered, centered, transpose_a=True, name="covariance") / 127.0
        tf1.self_adjoint_eig(covariance + 1e-3 * tf.eye(8), name="whitening")
    data = (np.random.RandomState(0).randn(128, 8) * 30).astype(np.float32)  # x^T x past 65504
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        with pytest.raises(tf.errors.InvalidArgumentError, match="decomposition was not successful"):
            session.run("whitening:0", {"x:0": data})
    (line,) = [line for line in ours(caplog) if "decomposes a matrix" in line]
    assert "failed in 'whitening' (SelfAdjointEigV2), which decomposes a matrix that float16" in line
    assert "keep it float32 with TFAMP_REWRITE_NODES_TO_EXCLUDE='^covariance$'" in line


def test_a_gather_given_indices_half_nodes_computed_out_of_bounds_names_them(caplog):
    """A bilinear sampler on a 2048-pixel row: positions from a MatMul, clipped to W - 1.001,
    floored.  In float16 the clip's bound is 2047, so floor + 1 is 2048, and the gather
    fails the run with TensorFlow's error alone.  The line names the half nodes the
    indices come from; keeping them float32 gives float32's values."""
    width = 2048
    graph = tf.Graph()
    with graph.as_default():
        row = tf.constant(np.arange(width, dtype=np.float32))
        points = tf1.placeholder(tf.float32, [3, 3], name="points")  # homogeneous [x, y, 1]
        x = tf.matmul(points, tf.constant([[1.0], [0.0], [0.5]]), name="positions")[:, 0]
        x = tf.clip_by_value(x, 0.0, width - 1.001)
        left = tf.floor(x, name="left")
        weight = x - left
        index = tf.cast(left, tf.int32)
        tf.add((1 - weight) * tf.gather(row, index), weight * tf.gather(row, index + 1), name="sampled")
    feed = {"points:0": [[10.0, 0.0, 1.0], [1000.0, 0.0, 1.0], [2046.9, 0.0, 1.0]]}
    with tf1.Session(graph=graph) as plain:
        expected = plain.run("sampled:0", feed)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        with pytest.raises(tf.errors.InvalidArgumentError, match="is not in"):
            session.run("sampled:0", feed)
    (line,) = [line for line in ours(caplog) if "whose indices float16 nodes computed" in line]
    assert "('left', 'positions')" in line
    setting = re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", line).group(1)
    with Session(graph=graph, nodes_to_exclude=setting.split(",")) as kept:
        np.testing.assert_allclose(kept.run("sampled:0", feed), expected, rtol=1e-6)


def test_a_decomposition_of_a_chain_of_half_products_names_the_whole_chain(caplog):
    """Classical MDS: the eigendecomposition of -J D2 J / 2 failed, the line named the last
    MatMul, and with it kept float32 the run failed again on the first one."""
    points = np.random.RandomState(0).uniform(0, 1000, (50, 2)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(points)
        squared = tf.reduce_sum(tf.square(x[:, None] - x[None]), -1)  # past 65504
        centering = tf.eye(50) - tf.ones([50, 50]) / 50.0
        gram = -0.5 * tf.matmul(tf.matmul(centering, squared, name="left"), centering, name="right")
        values, _ = tf1.self_adjoint_eig(gram, name="eig")
    with tf1.Session(graph=graph) as plain:
        expected = plain.run(values)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        with pytest.raises(tf.errors.InvalidArgumentError):
            session.run(values)
    (line,) = [line for line in ours(caplog) if "decomposes a matrix" in line]
    setting = re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", line).group(1).split(",")
    assert {"^left$", "^right$"} <= set(setting)
    with Session(graph=graph, nodes_to_exclude=setting) as kept:
        np.testing.assert_allclose(kept.run(values)[-2:], expected[-2:], rtol=1e-4)


@pytest.mark.parametrize("check", ["assert_less", "check_numerics"])
def test_a_check_failing_every_run_inside_a_while_loop_is_healed(caplog, check):
    """A check in a while loop's body on a MatMul past float16: every run failed before the
    search could look, nothing was healed, and the session closed saying none of its runs
    computed the node."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", initializer=np.full((4, 4), 20.0, np.float32))

        def body(i, total):
            h = tf.matmul(x, w, name="h")  # 3000 * 20 * 4 = 240000: inf in float16
            if check == "assert_less":
                guard = tf1.debugging.assert_less(tf.reduce_max(tf.abs(h)), 1e7, message="h too large")
            else:
                guard = tf1.debugging.check_numerics(h, "h not finite").op
            with tf.control_dependencies([guard]):
                return i + 1, total + tf.reduce_sum(h) * 1e-6

        _, total = tf1.while_loop(lambda i, _: i < 3, body, [0, 0.0])
        init = tf1.global_variables_initializer()
    feed = {"x:0": np.full((2, 4), 3000.0, np.float32)}
    failed = []
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for _ in range(4):
            try:
                result = session.run(total, feed)
            except tf.errors.InvalidArgumentError:
                failed.append(True)
        assert [n for heal in session.heals for n in heal.nodes][:1] == ["while/h"]
    assert len(failed) == 2 and result == pytest.approx(5.76, rel=1e-3)  # float32's, once healed
    assert "a session closed while looking" not in caplog.text


def test_a_float32_only_path_and_a_fed_tensor_are_not_watched():
    """Only tensors a half node lies upstream of are checked, and never a fed one."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        tf.argmax(tf.exp(x), 1, name="float32_only")  # Exp: deny list, float32
        tf.argmax(tf.matmul(x, tf.ones([4, 3]), name="logits"), 1, name="half")
    with Session(graph=graph) as session:
        private = session._shadow
        session.run("half:0", {"x:0": ORDINARY})

        def watched(fetch, fed=()):
            planned = session._inference._hidden.fetches([private.private_fetch(fetch)],
                                              [private.private_feed(t) for t in fed])
            return [str(each) for each in planned.entries] if planned else []

        assert watched("float32_only:0") == []
        assert watched("half:0") == ["'logits:0', read by 'half' (ArgMax)"]
        assert watched("half:0", fed=["logits:0"]) == []


def test_a_training_run_watches_what_its_forward_pass_hides_not_its_gradients():
    """A training run's checks name the forward reader of an overflowed denominator; the
    gradient's divisions by it (sorted first by name) are the loss scale's concern."""
    from tfamp_rewrite.training.hidden_non_finite import HiddenNonFinite

    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        w = tf1.get_variable("w", initializer=tf.ones([4, 3]))
        denominator = tf.matmul(x, w, name="denominator")
        loss = tf.reduce_mean(tf.math.divide(1.0, denominator, name="ratio"))
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf1.global_variables_initializer()
    with Session(graph=graph) as session:
        session.run(init)
        elements = [session._shadow.private_fetch(name) for name in (train.name, loss.name)]
        everything = map(str, HiddenNonFinite(session._shadow).fetches(elements).entries)
        planned = HiddenNonFinite(session._shadow, forward_only=True).fetches(elements)
        forward = [str(each) for each in planned.entries]
    assert any("read by 'gradients/" in each for each in everything)
    assert forward == ["'denominator:0', read by 'ratio' (RealDiv)"]


def tf1_control_flow_graph():
    """An argmax after a cond on ``is_training`` (dropout in one branch), and a greedy decoding
    loop whose argmax runs inside a while loop, after which another reads its output."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        is_training = tf1.placeholder_with_default(False, [], name="is_training")
        hidden = tf.matmul(x, tf.ones([4, 4]), name="hidden")
        branch = tf1.cond(is_training, lambda: tf.nn.dropout(hidden, rate=0.5),
                          lambda: tf.identity(hidden))
        tf.argmax(tf.matmul(branch, tf.ones([4, 3]), name="logits"), 1, name="after_cond")

        def step(i, state):
            token = tf.argmax(tf.matmul(state, tf.ones([4, 4]), name="step_logits"), 1,
                              name="in_loop")
            return i + 1, state + tf.one_hot(token, 4)

        _, final = tf1.while_loop(lambda i, _: i < 3, step, [0, hidden])
        tf.argmax(tf.matmul(final, tf.ones([4, 3]), name="final_logits"), 1, name="after_loop")
    return graph


@pytest.mark.parametrize("imported", [False, True], ids=["python_built", "imported_graph_def"])
def test_tf1_loops_and_branches_are_found_from_the_graph_alone(imported):
    graph = tf1_control_flow_graph()
    if imported:  # as a frozen graph: no control-flow contexts
        imported_graph = tf.Graph()
        with imported_graph.as_default():
            tf1.import_graph_def(graph.as_graph_def(), name="")
        graph = imported_graph
    op = graph.get_operation_by_name
    operations = graph.get_operations()
    inside = {operations[i] for i in control_flow_of(*tf_graph_inputs(operations))}

    def _in_control_flow(o):
        return o in inside

    assert _in_control_flow(op("while/step_logits")) and _in_control_flow(op("while/in_loop"))
    for outside in ("hidden", "logits", "after_cond", "final_logits", "after_loop"):
        assert not _in_control_flow(op(outside)), outside
    branch_ops = [o for o in graph.get_operations() if o.name.startswith("cond/dropout/")]
    assert branch_ops and all(_in_control_flow(o) for o in branch_ops)


def test_a_run_through_tf1_control_flow_watches_only_what_it_can_fetch(caplog):
    graph = tf1_control_flow_graph()
    fetches = ["after_cond:0", "after_loop:0"]
    with tf1.Session(graph=graph, config=plain_config()) as plain:
        expected = plain.run(fetches, {"x:0": ORDINARY})
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        values = session.run(fetches, {"x:0": ORDINARY})
        planned = session._inference._hidden.fetches([session._shadow.private_fetch(f) for f in fetches], [
            session._shadow.private_feed("x:0")])
    for value, want in zip(values, expected):
        np.testing.assert_array_equal(value, want)
    assert sorted(map(str, planned.entries)) == ["'final_logits:0', read by 'after_loop' (ArgMax)",
                                  "'logits:0', read by 'after_cond' (ArgMax)"]
    assert not hidden_lines(caplog)


def _metric_in_python(metric):
    """Prices in dollars (up to 1.2e5, past float16) from a float32 model, scored in Python."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        target = tf1.placeholder(tf.float32, [None], name="target")
        w = tf1.Variable(np.full((4, 1), 30000.0, np.float32), name="w")
        prediction = tf.squeeze(tf.matmul(x, w, name="out"), 1)
        scored = tf1.py_func(metric, [prediction, target], tf.float32, name="score")
        init = tf1.global_variables_initializer()
    features = np.random.RandomState(0).uniform(0, 1, (100, 4)).astype(np.float32)
    return graph, init, scored, {x: features, target: features.sum(1) * 30000.0}


def test_an_overflow_python_code_reads_is_found_and_healed(caplog, monkeypatch):
    """A 'within 10%' accuracy in numpy hides the inf of the half MatMul: 0.61 for float32's
    1.0, run after run, unsaid."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph, init, scored, feed = _metric_in_python(
        lambda p, y: np.float32(np.mean(np.abs(p - y) < 0.1 * y)))
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        scores = [session.run(scored, feed) for _ in range(4)]
    assert scores[0] < 0.9 and scores[-1] == 1.0
    (said,) = hidden_lines(caplog)
    assert "read by 'score' (PyFunc)" in said


def test_python_code_failing_on_an_overflow_names_the_half_node(caplog, monkeypatch):
    """sklearn's metrics raise "Input contains infinity": the run fails in the py_func, and
    the line names the half MatMul (not the Squeeze passing its value on) and its setting."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")

    def mean_absolute_error(p, y):
        if not np.isfinite(p).all():
            raise ValueError("Input contains infinity or a value too large for dtype('float32').")
        return np.float32(np.mean(np.abs(p - y)))

    graph, init, scored, feed = _metric_in_python(mean_absolute_error)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        with pytest.raises(tf.errors.InvalidArgumentError, match="Input contains infinity"):
            session.run(scored, feed)
    (said,) = [line for line in ours(caplog) if "whose Python code was given values" in line]
    assert "failed in 'score' (PyFunc)" in said and "('out')" in said
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^out$'" in said


def _gradients_of_a_summed_loss():
    """``(graph, optimizer, grads_and_vars)``: a per-example loss, summed by compute_gradients,
    whose gradients overflow float16 at the initial loss scale."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", [32, 3], initializer=tf1.constant_initializer(0.01))
        logits = tf.matmul(tf.constant(rng.rand(64, 32).astype(np.float32)), w)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=rng.randint(0, 3, 64),
                                                                     logits=logits)
        opt = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic")
        return graph, opt, opt.compute_gradients(per_example)


def test_gradients_fetched_before_training_are_said_to_overflow_at_the_loss_scale(caplog, monkeypatch):
    """A gradient norm printed before the first step: computed at the initial loss scale in a
    run that has no step to skip, it is inf. That is said, not blamed on a float16 value or
    a -1e9 mask, and no origin is looked for: the steps' own runs lower the scale."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph, opt, grads_and_vars = _gradients_of_a_summed_loss()
    with graph.as_default():
        norm = tf1.global_norm([g for g, _ in grads_and_vars])
        train = opt.apply_gradients(grads_and_vars)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        assert not np.isfinite(session.run(norm))
        for _ in range(5):
            session.run(train)
        assert np.isfinite(session.run(norm))
    (said,) = [line for line in ours(caplog) if "multiplied by the loss scale" in line]
    assert "'global_norm/global_norm:0'" in said and "no training step" in said
    assert not [line for line in ours(caplog) if "-1e9" in line or "the search for where" in line]


def _fitness_table(with_optimizer: bool):
    """An evolution strategy's fitness table: each candidate's loss, exp of a half MatMul's
    value, stored by scatter_update in a run of its own; exp(120) is inf in float32 too."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 2], name="x")
        w = tf1.Variable([[1.0], [1.0]], name="w")
        loss = tf.reduce_mean(tf.exp(tf.matmul(x, w)))
        if with_optimizer:  # makes the graph's state guarded
            LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic").minimize(loss)
        record = tf1.Variable(tf.zeros([3]), trainable=False, name="record")
        index = tf1.placeholder(tf.int32, [], name="index")
        put = tf1.scatter_update(record, index[None], loss[None], name="put")
        init = tf1.global_variables_initializer()
    return graph, init, put, record, x, index


@pytest.mark.parametrize("with_optimizer", [False, True])
def test_a_run_with_no_step_stores_the_inf_float32_stores(caplog, monkeypatch, with_optimizer):
    """The state guard keeps a skipped step's overflow out of batch-norm averages; in a run
    that computes no step it kept float32's own inf out of a fitness table, which read 0,
    and the diverged candidate was picked as the best. Said, as float32's may be."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph, init, put, record, x, index = _fitness_table(with_optimizer)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for k, value in enumerate([1.0, 2.0, 60.0]):
            session.run(put, {x: [[value, value]], index: k})
        recorded = session.run(record)
    np.testing.assert_allclose(recorded[:2], np.exp([2.0, 4.0]), rtol=1e-2)
    assert recorded[2] == np.inf
    (stored,) = [line for line in ours(caplog) if "starts in variable 'record'" in line]
    assert "computed in float32 ('Exp')" in stored and "mixed precision did not cause it" in stored
    assert "did cause it" not in stored


def test_a_node_the_skipped_step_healed_is_not_healed_again_by_the_same_runs_search(caplog, monkeypatch):
    """A running metric's update op fetched with the train op: the skipped step's diagnosis
    healed 'out/MatMul', then the origin search, reading that same run's statuses, healed
    it again and restarted the loss scale a second time."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        y = tf1.placeholder(tf.float32, [None, 1], name="y")
        prediction = tf1.layers.dense(x, 1, kernel_initializer=tf1.constant_initializer(20000.0), name="out")
        loss = tf1.losses.mean_squared_error(y, prediction)
        step = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-9), "dynamic").minimize(loss)
        _, running = tf1.metrics.mean_absolute_error(y, prediction)
        init = [tf1.global_variables_initializer(), tf1.local_variables_initializer()]
    big = np.ones([4, 8], np.float32)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for i in range(6):
            inputs = big if i % 2 == 0 else big / 10
            session.run([step, running, loss], {x: inputs, y: 160000.0 * inputs[:, :1]})
        assert session.heals
    healed = [line for line in ours(caplog) if line.startswith("tfamp_rewrite: healed:")]
    assert len(healed) == 1 and "'out/MatMul'" in healed[0], healed
    # the running total summed the skipped step's inf before the heal, and keeps it: said so,
    # not that no later run computed the node
    (kept,) = [line for line in ours(caplog) if "before the heal of 'out/MatMul'" in line]
    assert "variable 'mean_absolute_error/total'" in kept and "tf.local_variables_initializer()" in kept
    assert "no later run computed that node" not in caplog.text


def test_a_gradient_histogram_written_in_a_run_of_its_own_is_said_at_the_loss_scale(caplog, monkeypatch):
    """A Supervisor's summary thread runs the gradient histograms apart from the steps: their
    filter hides the loss-scaled gradients' inf, said as a float16 overflow to look for."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph, opt, grads_and_vars = _gradients_of_a_summed_loss()
    with graph.as_default():
        for grad, variable in grads_and_vars:
            tf1.summary.histogram(variable.op.name + "/gradient", grad)
        summaries = tf1.summary.merge_all()
        opt.apply_gradients(grads_and_vars)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        session.run(summaries)
    assert [line for line in ours(caplog) if "multiplied by the loss scale" in line]
    assert not [line for line in ours(caplog) if "do not show it" in line or "look for" in line]


def test_a_run_of_the_half_nodes_a_stored_overflow_came_from_finds_and_heals_them(caplog):
    """A covariance of raw sensor values stored (scaled) with tf.assign; the program then
    fetches the covariance: the search looked only at runs of the assignment or of the
    variable, so the MatMul kept overflowing, every fetch inf, with nothing healed."""
    rng = np.random.RandomState(0)
    data = (rng.normal(size=(4000, 3)) * [200.0, 150.0, 5.0] + [3000.0, 2400.0, 350.0]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        precision = tf1.get_variable("precision", [3, 3], trainable=False)
        centered = x - tf.reduce_mean(x, 0)
        covariance = tf.matmul(centered, centered, transpose_a=True, name="covariance") / 3999.0
        fit = tf1.assign(precision, covariance * 1e-3)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        session.run(fit.op, {x: data})
        fetched = [session.run(covariance, {x: data}) for _ in range(3)]
        assert [h.nodes[:1] for h in session.heals] == [["covariance"]]
    assert np.isfinite(fetched[-1]).all()
    assert not [r for r in caplog.records if "a session closed while looking" in r.getMessage()]

"""Skipped steps noticed, explained and healed: the guard, the diagnosis, the heal.

Sessions run emulated Tensor Core numerics (rewrite target cpu), so what overflows is
float16's 65504 on every CPU.  ``overflow_net`` is a two-layer classifier whose logits
MatMul overflows float16 on the first step when its inputs are large (a forward culprit
whatever the loss scale); ``scale_net`` is a regression whose gradients only overflow at
loss scales above 2**5 (the scale's business, not a culprit's).
"""
import json
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1
from tensorflow.core.protobuf import config_pb2

import tfamp_rewrite
from tfamp_rewrite.doctor import heal_files
from tfamp_rewrite.training import devices, heal_memory, step_watch
from tfamp_rewrite.training.session import TF_SESSION_CLASSES
from tfamp_rewrite.training.skip_guard import (
    PROBED_APPLIED_MOST,
    PROBED_THEN_EVERY,
    RECOVERED_AFTER,
    SkipGuard,
)
from tfamp_rewrite.training.step_signals import step_signals
from tfamp_rewrite.training.twins import twin_nodes, weight_siblings

tf1 = tf.compat.v1
INITIAL_SCALE = 2.0 ** 15


@pytest.fixture(autouse=True)
def emulated_cpu_amp(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    monkeypatch.delenv(step_watch.AUTO_FIX_ENV, raising=False)
    monkeypatch.delenv(heal_memory.HEAL_FILE_ENV, raising=False)
    monkeypatch.setattr(devices, "_logged", set())
    monkeypatch.setattr(step_watch, "_said_probing", False)
    monkeypatch.setattr(step_watch, "_said_probing_pause", False)
    monkeypatch.setattr(step_watch, "_said_heal_file_hint", False)


# -- the guard's rule ---------------------------------------------------------------------

def test_a_scale_that_starts_too_high_falls_without_a_diagnosis():
    guard = SkipGuard(min_loss_scale=1.0)
    for scale in (2.0 ** 15, 2.0 ** 14, 2.0 ** 13):
        guard.observe(scale, applied=False)
    assert not guard.diagnosis_due
    for _ in range(RECOVERED_AFTER):
        guard.observe(2.0 ** 12, applied=True)
    assert guard.episode is None and not guard.diagnosis_due


def test_a_fall_of_2_to_the_8_is_diagnosed_once_and_the_floor_once_more():
    guard = SkipGuard(min_loss_scale=1.0, fall_log2=8)
    scales = [2.0 ** e for e in range(15, 6, -1)]           # 2**15 .. 2**7: fallen by 2**8
    for scale in scales[:-1]:
        guard.observe(scale, applied=False)
    assert not guard.diagnosis_due
    guard.observe(scales[-1], applied=False)
    assert guard.diagnosis_due
    guard.diagnosed(named=False)                             # a gradient: the scale's business
    for e in range(6, 0, -1):
        guard.observe(2.0 ** e, applied=False)
    assert not guard.diagnosis_due                           # no second diagnosis on the way down
    guard.observe(1.0, applied=False)
    assert guard.diagnosis_due and guard.at_floor           # the floor: diagnosed once more
    guard.diagnosed(named=True)
    guard.observe(1.0, applied=False)
    assert not guard.diagnosis_due                           # named: said once per episode
    expected = "32768 -> 16384 -> 8192 -> 4096 -> ... -> 2 -> 1 -> 1 (17 skipped steps)"
    assert guard.episode.trajectory() == expected


def test_steps_applied_in_a_row_end_the_episode_and_hand_it_back():
    guard = SkipGuard(min_loss_scale=1.0, fall_log2=2)
    assert guard.observe(2.0 ** 15, applied=True) is None
    for scale in (2.0 ** 15, 2.0 ** 14, 2.0 ** 13):
        assert guard.observe(scale, applied=False) is None
    for _ in range(RECOVERED_AFTER - 1):
        assert guard.observe(2.0 ** 12, applied=True) is None
    ended = guard.observe(2.0 ** 12, applied=True)
    assert ended.skipped == 3 and guard.fell_far(ended, min(ended.scales))
    assert guard.episode is None and "(3 skipped steps)" in ended.trajectory()


def test_batches_that_overflow_now_and_then_keep_one_episode_falling():
    """Every other batch skipped: the applied ones between do not end the episode, so its
    fall adds up to a diagnosis, which waits for a skipped step to carry the probes."""
    guard = SkipGuard(min_loss_scale=1.0)
    scale = 2.0 ** 15
    for _ in range(8):
        guard.observe(scale, applied=False)
        scale /= 2
        assert guard.observe(scale, applied=True) is None
    assert not guard.diagnosis_due
    guard.observe(scale, applied=False)                      # 2**7: fallen by 2**8
    assert guard.diagnosis_due
    guard.observe(scale / 2, applied=True)
    assert guard.diagnosis_due                               # still due: it applied
    assert "(9 skipped steps, 8 applied between them)" in guard.episode.trajectory()


def test_batches_that_overflow_one_in_25_still_fall_as_one_episode_to_a_diagnosis():
    """A near-empty memory row one batch in 25 (an NTM): each skip was an episode of its own,
    ended by the applied steps after it, so the scale walked down to 1 and no diagnosis was
    ever due.  A later skip resumes the episode while the scale has not grown since, and the
    episode no longer ends between skips as far apart as those seen before."""
    guard = SkipGuard(min_loss_scale=1.0)
    scale, ended = 2.0 ** 15, []
    for _ in range(8):
        guard.observe(scale, applied=False)
        scale /= 2
        ended += [guard.observe(scale, applied=True) for _ in range(24)]
    assert not guard.diagnosis_due
    guard.observe(scale, applied=False)                      # 2**7: fallen by 2**8
    assert guard.diagnosis_due
    assert [e for e in ended if e is not None] == [ended[RECOVERED_AFTER - 1]]  # the first only
    assert "(9 skipped steps, 192 applied between them)" in guard.episode.trajectory()
    guard.diagnosed(named=False)
    for _ in range(7):
        scale /= 2
        for _ in range(24):
            guard.observe(scale, applied=True)
        guard.observe(scale, applied=False)
    assert guard.at_floor and guard.diagnosis_due            # the floor: diagnosed once more


def test_a_scale_that_grew_again_starts_a_new_episode():
    guard = SkipGuard(min_loss_scale=1.0)
    guard.observe(2.0 ** 15, applied=False)
    for _ in range(RECOVERED_AFTER):
        guard.observe(2.0 ** 14, applied=True)
    guard.observe(2.0 ** 15, applied=True)                   # 2000 finite steps later: doubled
    guard.observe(2.0 ** 15, applied=False)
    assert guard.episode.trajectory() == "32768 (1 skipped step)"


def test_a_skip_whose_loss_is_not_finite_is_diagnosed_at_once_once_per_episode():
    """No loss scale makes or mends an inf/nan loss: no fall of the scale is waited for."""
    guard = SkipGuard()
    guard.observe(INITIAL_SCALE, applied=False, loss_finite=False)
    assert guard.diagnosis_due
    guard.diagnosed(named=False)
    guard.observe(INITIAL_SCALE / 2, applied=False, loss_finite=False)
    assert not guard.diagnosis_due    # the fall and the floor decide the rest of the episode
    for _ in range(RECOVERED_AFTER):
        guard.observe(INITIAL_SCALE / 4, applied=True)
    guard.observe(INITIAL_SCALE / 4, applied=False, loss_finite=True)
    assert not guard.diagnosis_due    # gradients alone: the scale may still be too high


def test_a_due_diagnosis_rides_so_many_applied_steps_then_one_in_so_many():
    """Skips a thousand steps apart carried the probes (twice the step time) on every step
    between them: they ride PROBED_APPLIED_MOST applied steps in a row, then one in
    PROBED_THEN_EVERY, until a step skips."""
    guard = SkipGuard(min_loss_scale=1.0, fall_log2=2)
    for scale in (2.0 ** 15, 2.0 ** 14, 2.0 ** 13):
        guard.observe(scale, applied=False)
    assert guard.diagnosis_due
    for _ in range(40):
        guard.observe(2.0 ** 12, applied=True)
    guard.observe(2.0 ** 12, applied=False)     # skips 40 steps apart: the episode goes on
    for _ in range(PROBED_APPLIED_MOST - 1):
        guard.observe(2.0 ** 11, applied=True)
    assert guard.diagnosis_due
    due = []
    for _ in range(2 * PROBED_THEN_EVERY):
        guard.observe(2.0 ** 11, applied=True)
        due.append(guard.diagnosis_due)
    assert sum(due) == 2 and guard.episode is not None
    guard.observe(2.0 ** 11, applied=False)     # a skip: every step carries them again
    assert guard.diagnosis_due


def test_after_a_heal_the_first_skip_is_diagnosed_at_once():
    guard = SkipGuard()
    guard.restart(after_heal=True)
    guard.observe(INITIAL_SCALE, applied=False)
    assert guard.diagnosis_due


# -- sessions -------------------------------------------------------------------------------

def overflow_net(input_scale=2000.0, pipeline=None, seed=0):
    """x [16, 32] (input_scale * N(0, 1)) -> relu(x w1) -> logits = h w2 -> softmax xent.

    Weights ~ N(0, 1): with input_scale 2000 the hidden values are ~1e4 and the logits ~1e5,
    beyond float16's 65504.  ``pipeline``: None (placeholders), ``"queue"`` (queue runners:
    ``slice_input_producer`` and ``batch``, one thread each, in order) or ``"dataset"`` (a
    ``tf.data`` iterator); 64 batches of fixed data, each step takes the next.
    """
    rng = np.random.RandomState(seed)
    inputs = (rng.standard_normal([64 * 16, 32]) * input_scale).astype(np.float32)
    labels = rng.randint(0, 4, 64 * 16).astype(np.int32)
    graph = tf.Graph()
    parts = {}
    with graph.as_default():
        tf1.set_random_seed(seed)
        if pipeline == "queue":
            example = tf1.train.slice_input_producer([inputs, labels], shuffle=False)
            x, y = tf1.train.batch(example, 16, num_threads=1, capacity=64)
        elif pipeline == "dataset":
            dataset = tf1.data.Dataset.from_tensor_slices((inputs, labels)).batch(16)
            x, y = tf1.data.make_one_shot_iterator(dataset).get_next()
        else:
            x = tf1.placeholder(tf.float32, [16, 32], name="x")
            y = tf1.placeholder(tf.int32, [16], name="y")
            parts["feed"] = {x: inputs[:16], y: labels[:16]}
        parts["batch"] = x
        w1 = tf1.get_variable("w1", initializer=tf1.random_normal([32, 64], stddev=1.0, seed=1))
        w2 = tf1.get_variable("w2", initializer=tf1.random_normal([64, 4], stddev=1.0, seed=2))
        h = tf.nn.relu(tf.matmul(x, w1, name="hidden"))
        logits = tf.matmul(h, w2, name="logits")
        cross_entropy = tf1.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        parts["loss"] = tf.reduce_mean(cross_entropy)
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.MomentumOptimizer(1e-9, 0.9), "dynamic")
        parts["global_step"] = tf1.train.get_or_create_global_step()
        parts["train"] = opt.minimize(parts["loss"], global_step=parts["global_step"])
        parts["init"] = tf1.global_variables_initializer()
        parts["local_init"] = tf1.local_variables_initializer()  # slice_input_producer's epochs
        parts["scale"] = opt.loss_scale()
    parts["graph"] = graph
    return parts


def healed_checkpoint(path):
    """``(heals, prefix)`` of ``overflow_net`` trained 12 steps (its logits healed) and saved
    at ``path`` by a Saver."""
    parts = overflow_net()
    with parts["graph"].as_default():
        saver = tf1.train.Saver()
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 12)
        return session.heals, saver.save(session, path)


def train(parts, session, steps, through="run"):
    """Runs ``steps`` training steps; returns their losses.  ``through="callable"``: by a
    callable made from options, as Keras in TF1 graph mode trains."""
    feed = parts.get("feed") or {}
    if through == "run":
        return [session.run([parts["train"], parts["loss"]], feed)[1] for _ in range(steps)]
    call = session._make_callable_from_options(config_pb2.CallableOptions(
        feed=[key.name for key in feed], fetch=[parts["loss"].name], target=[parts["train"].name]))
    return [call(*feed.values())[0] for _ in range(steps)]


@pytest.mark.parametrize("accept_options", [False, True])
def test_a_callable_made_without_a_feed_list_has_its_steps_watched_and_healed(caplog, accept_options):
    """sess.make_callable(train_op) over a tf.data pipeline ran TensorFlow's callable of the
    private graph: every step skipped unsaid (global_step 0 of 300), and after a heal by a
    logging sess.run the callable kept running the unhealed graph."""
    parts = overflow_net(pipeline="dataset")
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            step = session.make_callable([parts["train"], parts["loss"]], accept_options=accept_options)
            for _ in range(40):
                step()
            steps = session.run(parts["global_step"])
            assert session.heals
    assert culprit_messages(caplog)
    assert steps > 10


def test_a_queue_runners_enqueue_callable_runs_as_tensorflows_and_trains_through_heals(monkeypatch):
    """A queue runner makes a callable of its enqueue op and calls it once per example: each
    call made as a watched run made queue-fed training 4-5x slower, though an enqueue of
    constants computes nothing in half. Such a callable is TensorFlow's, made again after a
    heal; the train op's is still a watched run."""
    parts = overflow_net(pipeline="queue")
    runs = []
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        real_run = session.run
        monkeypatch.setattr(session, "run", lambda *a, **k: runs.append(a[0]) or real_run(*a, **k))
        session.run(parts["init"])
        coordinator = tf1.train.Coordinator()
        threads = tf1.train.start_queue_runners(session, coord=coordinator)
        try:
            step = session.make_callable(parts["train"])
            for _ in range(40):
                step()
            assert session.heals and session.run(parts["global_step"]) > 10
        finally:
            coordinator.request_stop()
            coordinator.join(threads)
    queue_runs = [r for r in runs if "enqueue" in str(getattr(r, "name", r)).lower()]
    assert not queue_runs and len(runs) >= 40  # the train op's calls are runs


def test_a_converted_node_on_no_list_is_said_as_such(caplog):
    """Raw counts cast to float in the graph: the Cast is converted (it casts to half) but is
    on no list, and the culprit line read "'x' (Cast, None list)"."""
    graph = tf.Graph()
    with graph.as_default():
        raw = tf1.placeholder(tf.int64, [None, 2], "raw_counts")
        x = tf.cast(raw, tf.float32, name="x")
        w = tf1.Variable(tf.fill([2, 1], 1e-6))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-12), "dynamic")
        train_op = optimizer.minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(6):
            session.run([loss, train_op], {raw: [[3, 100000], [5, 200]]})
    (message,) = culprit_messages(caplog)
    assert "'x' (Cast, no list)" in message and "None list" not in message


def test_features_of_an_image_optimized_as_a_variable_are_no_weights(caplog):
    """Neural style: the image is the variable, the Gram matrix of its conv features
    overflows. The heal kept the whole feature tower float32 as 'computing the weights they
    read' (25 nodes and 54 more in a VGG-style program); the features are activations."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        kernel = tf.constant(rng.normal(0, 0.3, (3, 3, 3, 8)).astype(np.float32))
        image = tf1.Variable(rng.uniform(0, 255, (1, 32, 32, 3)).astype(np.float32), name="image")
        features = tf.reshape(tf.nn.relu(tf1.nn.conv2d(image - 120.0, kernel, [1, 1, 1, 1], "SAME")), [-1, 8])
        gram = tf.matmul(features, features, transpose_a=True) / 8192.0
        loss = tf.reduce_mean(tf.square(gram - 10.0))
        train_op = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1.0), "dynamic").minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(10):
            session.run([loss, train_op])
        assert session.heals
    healed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tfamp_rewrite: healed:")]
    assert healed and not [line for line in healed if "computing the weights" in line or "Conv2D" in line]


def culprit_messages(caplog):
    return [r.getMessage() for r in caplog.records if "training steps are being skipped" in r.getMessage()]


def test_a_forward_overflow_is_named_healed_and_training_goes_on(caplog):
    parts = overflow_net()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            losses = train(parts, session, 12)
            step_after_heal = session.run(parts["global_step"])
            more = train(parts, session, 25)  # the restarted scale falls, then steps apply
            final_step = session.run(parts["global_step"])
    (message,) = culprit_messages(caplog)
    assert "'logits' (MatMul, allow list)" in message and "forward value 'logits:0'" in message
    # the loss itself was NaN: diagnosed on the next skipped step, not after a fall of 2**8
    assert "loss scale 32768 -> 16384 (2 skipped steps)" in message
    (first,) = [r.getMessage() for r in caplog.records if "a training step was skipped" in r.getMessage()]
    assert "its loss itself was inf/nan" in first and "a global_step it advances stays where it is" in first
    assert "ALLOWLIST_REMOVE=MatMul" in message and "TFAMP_REWRITE_NODES_TO_EXCLUDE='^logits$" in message
    assert "heal 1 of at most 16" in message
    (heal,) = session.heals
    assert heal.culprit == "logits:0" and "logits" in heal.nodes and heal.max_abs > 65504
    assert not np.isfinite(losses[0])                        # the half logits were inf
    assert all(np.isfinite(more)) and final_step > step_after_heal      # applied again
    assert more[-1] < more[0]
    assert session.rewrite_reports[-1].decision("logits").dtype == "float32"
    # building the probes, a wait on a large graph, is said before the first diagnosis, once
    (probing,) = [r.getMessage() for r in caplog.records if "adding range probes" in r.getMessage()]
    assert "float16 tensors and the float32 values around them" in probing  # a float32 origin too
    # without a heal file, the heal says how other processes (evaluation, serving) start healed
    (healed,) = [r.getMessage() for r in caplog.records if "tfamp_rewrite: healed:" in r.getMessage()]
    assert "TFAMP_REWRITE_HEAL_FILE=path set in both" in healed
    assert "restores a checkpoint this session saves" in healed


def test_a_long_first_probed_step_says_how_long_it_took_once(monkeypatch, caplog):
    """The pause a diagnosis makes (building the probes, TensorFlow preparing the step with
    them) is said, with its length, once; the one after a heal (a new generation of the
    graph, prepared anew) once more; a quick one is not."""
    monkeypatch.setattr(step_watch, "PAUSE_SAID_AFTER", 0.0)
    parts = overflow_net()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            train(parts, session, 12)
            assert session.heals
    said = [r.getMessage() for r in caplog.records if "fetching the range probes" in r.getMessage()]
    assert len(said) == 2 and re.search(r"of \d+ float16 tensors took \d+\.\d s", said[0])
    assert said[1].startswith("tfamp_rewrite: after the heal, the first step fetching the range probes took")
    monkeypatch.setattr(step_watch, "PAUSE_SAID_AFTER", 1e9)
    monkeypatch.setattr(step_watch, "_said_probing_pause", False)
    monkeypatch.setattr(step_watch, "_said_probing", False)
    monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # a new process: diagnosed again
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        again = overflow_net()
        with tfamp_rewrite.Session(graph=again["graph"]) as session:
            session.run(again["init"])
            train(again, session, 12)
    assert "adding range probes" in caplog.text and "fetching the range probes" not in caplog.text


def test_weights_holding_nan_are_named_nothing_is_healed_and_a_nan_loss_hook_stops(caplog):
    """A restored checkpoint of a run that diverged: no half tensor is to blame, no heal helps."""
    from tfamp_rewrite.training import activation

    parts = overflow_net(input_scale=1.0)  # fits float16: only the poisoned weight is not finite
    with parts["graph"].as_default():
        (w1,) = [v for v in tf1.trainable_variables() if v.op.name == "w1"]
        one_nan = np.ones([32, 64], np.float32)
        one_nan[3, 5] = np.nan
        poison = tf1.assign(w1, w1 * one_nan)
        hooks = [tf1.train.NanTensorHook(parts["loss"])]
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            session.run(poison)
            losses = train(parts, session, 20)
            assert session.heals == [] and session.run(parts["global_step"]) == 0
        activation.enable_graph_rewrite()
        try:
            with parts["graph"].as_default(), \
                    tf1.train.MonitoredTrainingSession(hooks=hooks) as monitored:
                monitored.run_step_fn(lambda step_context: step_context.session.run(poison))
                with pytest.raises(tf1.train.NanLossDuringTrainingError):
                    for _ in range(20):
                        monitored.run([parts["train"], parts["loss"]], parts["feed"])
        finally:
            activation.deactivate()
    assert not any(np.isfinite(losses))
    said = [r.getMessage() for r in caplog.records if "own weights are not finite" in r.getMessage()]
    assert len(said) == 2  # once per session
    assert "trainable variable 'w1' holds inf/nan" in said[0] and "nothing is healed" in said[0]
    assert not culprit_messages(caplog) or all("own weights" in m for m in culprit_messages(caplog))


def test_a_step_fed_inf_is_said_to_be_fed_it_and_nothing_is_healed(caplog):
    """A DQN's TD target computed by a run of its target network and fed back: when it holds
    inf, every step skips.  No half node is to blame, and a float32 node turning inf from it
    is its victim, not a presumed culprit: the warning names the fed tensor."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        target = tf1.placeholder(tf.float32, [8], name="target")
        w = tf1.get_variable("w", initializer=tf1.random_normal([4, 1], stddev=0.1, seed=1))
        q = tf.reshape(tf.matmul(x, w, name="q"), [-1])
        loss = tf.reduce_mean(tf.square(target - q))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: np.ones([8, 4], np.float32), target: np.full([8], np.inf, np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(20):
                session.run(train_op, feed)
    said = [r.getMessage() for r in caplog.records if "because the run was fed inf/nan" in r.getMessage()]
    assert len(said) == 1 and "'target:0' holds inf/nan" in said[0]
    assert session.heals == [] and culprit_messages(caplog) == said
    assert "every step is skipped" not in caplog.text          # not 'nothing found'


@pytest.mark.parametrize("fed", ["finite", "inf"])
def test_a_step_fed_a_sparse_tensor_is_diagnosed(caplog, fed):
    """A recommender's sparse features (``sparse_placeholder``, a SparseTensorValue): the
    diagnosis of its skipped steps reads the run's feeds, and names sparse values fed inf
    as it names dense ones, rather than failing on the sparse value."""
    graph = tf.Graph()
    with graph.as_default():
        features = tf1.sparse_placeholder(tf.float32, name="features")
        embeddings = tf1.get_variable("embeddings", [20, 8], initializer=tf1.ones_initializer())
        w = tf1.get_variable("w", [8, 8], initializer=tf1.constant_initializer(300.0))
        hidden = tf1.sparse_tensor_dense_matmul(features, embeddings)
        logits = tf.matmul(tf.matmul(hidden, w), w, name="logits")  # 2.9e7: past float16
        loss = tf.reduce_mean(tf.square(logits)) * 1e-12
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-9), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    values = np.array([5.0, np.inf if fed == "inf" else 5.0], np.float32)
    batch = tf1.SparseTensorValue(indices=np.array([[0, 1], [1, 3]]), values=values,
                                  dense_shape=np.array([2, 20]))
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(20):
                session.run(train_op, {features: batch})
    said = [r.getMessage() for r in caplog.records if "because the run was fed inf/nan" in r.getMessage()]
    if fed == "inf":
        assert len(said) == 1 and "'features/values:0' holds inf/nan" in said[0]
    else:
        assert said == [] and [h.culprit for h in session.heals][:1] == ["logits:0"]


def test_a_write_of_a_skipped_steps_gradients_writes_finite_entries_only(monkeypatch, caplog):
    """SAM's perturbation w += rho * g / |g|, g from the loss-scaled compute_gradients, wrote a
    skipped step's inf/nan into w for good (the weights NaN, 'nothing is healed').  The
    session writes its finite entries only, and says so when it first runs; the steps skip
    until the scale fits, then train.  It is loss-scaled: no 'trains without loss scaling'."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    rng = np.random.RandomState(0)
    inputs = rng.standard_normal([64, 16]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [64, 16], name="x")
        y = tf1.placeholder(tf.float32, [64, 1], name="y")
        w = tf1.get_variable("w", [16, 1], initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01), "dynamic")
        ((g, _),) = opt.compute_gradients(loss, [w])
        perturbation = 0.05 * g / (tf.norm(g) + 1e-12)
        with tf.control_dependencies([tf1.assign_add(w, perturbation, name="perturb")]):
            ((g_adv, _),) = opt.compute_gradients(tf.identity(loss), [w])
        with tf.control_dependencies([g_adv]):
            restore = tf1.assign_sub(w, perturbation, name="restore")
        with tf.control_dependencies([restore]):
            train_op = opt.apply_gradients([(tf.identity(g_adv), w)])
        init = tf1.global_variables_initializer()
    feed = {x: inputs, y: inputs @ rng.standard_normal([16, 1]).astype(np.float32) * 30}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(16):
                session.run(train_op, feed)
            trained = session.run(w)
    (before,) = [r.getMessage() for r in caplog.records if "without waiting on" in r.getMessage()]
    assert "writes to trainable variable 'w'" in before and "writes only its finite entries" in before
    assert np.isfinite(trained).all() and np.abs(trained).max() > 0
    assert "own weights are not finite" not in caplog.text and "without loss scaling" not in caplog.text


@pytest.mark.parametrize("variable", ["ref", "resource"])
def test_a_sparse_update_by_hand_of_loss_scaled_gradients_keeps_the_table_finite(caplog, variable):
    """word2vec-style SGD of an embedding table by tf.scatter_sub of compute_gradients'
    IndexedSlices, the rest by apply_gradients: the first step overflows float16 at the
    initial scale, and the scatter wrote its inf rows for good -- unsaid (only assignments
    were known), then 'the model's own weights are not finite: mixed precision did not
    cause it'.  The scatter now writes finite rows only; the table stays finite and trains."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int64, [None], name="ids")
        y = tf1.placeholder(tf.float32, [None, 4], name="y")
        table = tf1.get_variable("table", initializer=rng.standard_normal([100, 16]).astype(np.float32),
                                 use_resource=variable == "resource")
        w = tf1.get_variable("w", initializer=rng.standard_normal([16, 4]).astype(np.float32))
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.embedding_lookup(table, ids), w) - y))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-4), "dynamic")
        (g_table, _), (g_w, _) = opt.compute_gradients(loss, [table, w])
        sparse_update = tf1.scatter_sub(table, g_table.indices, 1e-4 * g_table.values, name="sparse_sgd")
        train = tf.group(sparse_update, opt.apply_gradients([(g_w, w)]))
        init = tf1.global_variables_initializer()
    feeds = [{ids: rng.randint(100, size=32), y: 300 * rng.standard_normal([32, 4])} for _ in range(12)]
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            before = session.run(table)
            for feed in feeds:
                session.run(train, feed)
            after = session.run(table)
    assert np.isfinite(after).all() and not np.array_equal(after, before)
    (said,) = [r.getMessage() for r in caplog.records if "without waiting on" in r.getMessage()]
    assert "'sparse_sgd' writes to trainable variable 'table'" in said
    assert "own weights are not finite" not in caplog.text


def test_a_write_that_only_waits_on_the_gradients_is_not_said_to_write_them(caplog, monkeypatch):
    """SAM's restore ``w -= e`` of a perturbation held in a variable, under a control
    dependency on the loss-scaled gradients: it writes ``e``, which holds no gradient, so the
    advice to compute it from finite gradients does not apply."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.Variable(np.ones([4, 2], np.float32), name="w")
        e = tf1.Variable(np.full([4, 2], 0.01, np.float32), trainable=False, name="e")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic")
        grads_and_vars = opt.compute_gradients(loss)
        with tf.control_dependencies([g for g, _ in grads_and_vars]):
            restore = tf1.assign_sub(w, e, name="restore")
        with tf.control_dependencies([restore]):
            train_op = opt.apply_gradients(grads_and_vars)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            session.run(train_op, {x: np.ones([8, 4], np.float32)})
    assert "without waiting on" not in caplog.text


def test_a_heal_keeps_the_same_layer_of_a_target_network_float32(caplog):
    """A DQN: online and target networks of the same layers under two scopes; the target's
    Q values come from an inference run (never healed) and are fed back as the TD target.
    Healing the online network's overflowing MatMul keeps its target twin float32 too."""
    def q_network(states, scope):
        with tf1.variable_scope(scope):
            hidden = tf1.layers.dense(states, 16, tf.nn.relu, name="h",
                                      kernel_initializer=tf1.constant_initializer(1.0))
            return tf1.layers.dense(hidden, 2, name="q", kernel_initializer=tf1.constant_initializer(1000.0))

    graph = tf.Graph()
    with graph.as_default():
        states = tf1.placeholder(tf.float32, [32, 4], name="states")
        next_states = tf1.placeholder(tf.float32, [32, 4], name="next_states")
        target = tf1.placeholder(tf.float32, [32], name="td_target")
        q, q_next = q_network(states, "online"), q_network(next_states, "target")
        best_next = tf.reduce_max(q_next, axis=1)
        loss = tf1.losses.huber_loss(target, q[:, 0])
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    batch = np.random.RandomState(0).rand(32, 4).astype(np.float32) + 1.0  # Q about 1e5
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(14):
                td_target = 1.0 + 0.99 * session.run(best_next, {next_states: batch})
                session.run(train_op, {states: batch, target: td_target})
            assert np.isfinite(session.run(best_next, {next_states: batch})).all()
    (heal,) = session.heals
    assert "online/q/MatMul" in heal.nodes and "target/q/MatMul" in heal.nodes
    (healed,) = [r.getMessage() for r in caplog.records if "tfamp_rewrite: healed:" in r.getMessage()]
    assert re.search(r"healed: '(online|target)/q/MatMul' now float32, with '(target|online)/q/MatMul', "
                     r"the same layer elsewhere \(under another scope", healed)
    # the line naming the cause (a skipped step's, or the search an inference run started)
    (finding,) = [r.getMessage() for r in caplog.records if "are being skipped" in r.getMessage()
                  or "found where the inf/nan starts" in r.getMessage()]
    edit = re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", finding).group(1).split(",")
    assert {"^target/q/MatMul$", "^online/q/MatMul$"} <= set(edit)  # the edit keeps both


def test_twins_are_the_same_layer_under_another_top_scope_not_another_layer():
    """'online/q/MatMul' has a twin 'target/q/MatMul'; of a plain MLP's 'dense/MatMul',
    'dense_1/MatMul' and 'dense_2/MatMul', none is another's twin; nor, of dense layers on
    frames ([batch, time, features]: each a Tensordot), 'fc1/Tensordot/MatMul' and
    'fc2/Tensordot/MatMul', two layers named alike past their own scopes."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4])
        hidden = tf1.layers.dense(tf1.layers.dense(x, 4, tf.nn.relu), 4, tf.nn.relu)
        tf1.layers.dense(hidden, 4, tf.nn.relu)
        for scope in ("online", "target"):
            with tf1.variable_scope(scope):
                tf1.layers.dense(tf1.layers.dense(x, 4, tf.nn.relu, name="h"), 2, name="q")
        frames = tf1.placeholder(tf.float32, [2, 5, 4])
        tf1.layers.dense(tf1.layers.dense(frames, 4, tf.nn.relu, name="fc1"), 4, name="fc2")
    every = {op.name for op in graph.get_operations()}
    assert twin_nodes(graph, ["online/q/MatMul"], every) == ["target/q/MatMul"]
    assert twin_nodes(graph, ["online/h/Relu"], every) == ["target/h/Relu"]
    assert twin_nodes(graph, ["dense_1/MatMul"], every) == []
    assert twin_nodes(graph, ["fc1/Tensordot/MatMul", "fc1/Tensordot/Reshape"], every) == []


def test_a_healed_ssim_keeps_its_other_filters_float32_and_matches_float32(caplog):
    """SSIM of 0..255 images: the heal of the overflowing filter (over x^2 + y^2) keeps the
    same Gaussian filter over x, y and xy float32 too -- left half, the variance
    E[xy] - E[x]E[y] lost to cancellation: 0.830 for float32's 0.839."""
    rng = np.random.RandomState(0)
    first = rng.uniform(0, 255, (4, 32, 32, 3)).astype(np.float32)
    first[:, :16] = 240.0                                   # x^2 + y^2 beyond 65504
    second = np.clip(np.round(first + rng.normal(0, 8, first.shape)), 0, 255).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, first.shape)
        y = tf1.placeholder(tf.float32, first.shape)
        ssim = tf.reduce_mean(tf.image.ssim(x, y, max_val=255.0))
    feed = {x: first, y: second}
    with tf1.Session(graph=graph) as session:
        expected = session.run(ssim, feed)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        values = [session.run(ssim, feed) for _ in range(4)]
        (heal,) = session.heals
    assert {"SSIM/depthwise", "SSIM/depthwise_1", "SSIM/depthwise_2", "SSIM/depthwise_3"} <= set(heal.nodes)
    assert values[-1] == pytest.approx(expected, abs=1e-4)
    # the run that found it returned values of the graph before the heal: said
    (healed,) = [r.getMessage() for r in caplog.records if "tfamp_rewrite: healed:" in r.getMessage()]
    assert "runs from the next on compute with it (the values this run returned did not)" in healed


def test_a_healed_ssim_loss_reads_its_filter_at_full_precision_in_training():
    """An SSIM loss of 0..255 images in training: the backward pass's filters stay half and
    read the tiled Gaussian filter too, so the healed forward filters read it rounded to
    half -- the SSIM training fetched was 0.698 where float32 gives 0.712 for the same image.
    The filter's producers are kept float32 with the heal (weight_producers)."""
    rng = np.random.RandomState(0)
    clean = rng.uniform(0, 255, (4, 32, 32, 3)).astype(np.float32)
    clean[:, :16] = 240.0                                   # x^2 + y^2 beyond 65504
    noisy = np.clip(clean + rng.normal(0, 20, clean.shape), 0, 255).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, clean.shape)
        y = tf1.placeholder(tf.float32, clean.shape)
        out = x + 255.0 * tf1.layers.conv2d(x / 255.0, 3, 3, padding="same",
                                            kernel_initializer=tf1.zeros_initializer())
        ssim = tf.reduce_mean(tf.image.ssim(out, y, max_val=255.0))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(1.0 - ssim)
        init = tf1.global_variables_initializer()
    feed = {x: noisy, y: clean}
    with tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(30):
            _, shown = session.run([train_op, ssim], feed)
        variables = graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)
        weights = session.run(variables)
        assert session.heals
    with tf1.Session(graph=graph) as plain:  # float32's SSIM of the same weights
        for variable, value in zip(variables, weights):
            variable.load(value, plain)
        truth = plain.run(ssim, feed)
    assert shown == pytest.approx(truth, abs=2e-3)


def test_weight_siblings_apply_the_same_weights_not_read_the_same_data():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4])
        kernel = tf1.get_variable("kernel", [4, 4])
        steps = [tf.matmul(x + float(t), kernel, name="step_%d" % t) for t in range(3)]
        tf.matmul(steps[0], tf1.get_variable("head", [4, 2]), name="head_a")  # reads step_0's data
        tf.matmul(steps[0], tf1.get_variable("other", [4, 2]), name="head_b")
    every = {op.name for op in graph.get_operations()}
    assert weight_siblings(graph, ["step_0"], every) == ["step_1", "step_2"]
    assert weight_siblings(graph, ["head_a"], every) == []


def test_a_student_is_no_twin_of_its_wider_teacher():
    """Distillation names a teacher's and a student's layers alike; a 64-wide student's
    'student/out/MatMul' is not the same layer as a 256-wide teacher's 'teacher/out/MatMul'."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 64])
        for scope, width in (("teacher", 256), ("student", 64), ("student_copy", 64)):
            with tf1.variable_scope(scope):
                tf1.layers.dense(tf1.layers.dense(x, width, tf.nn.relu, name="fc1"), 10, name="out")
    every = {op.name for op in graph.get_operations()}
    assert twin_nodes(graph, ["student/out/MatMul"], every) == ["student_copy/out/MatMul"]
    assert twin_nodes(graph, ["teacher/fc1/MatMul"], every) == []


@pytest.mark.parametrize("resource", [False, True])
def test_a_function_called_again_has_twins_where_it_reads_the_same_variables(resource):
    """SSIM as the loss and again as a metric ('SSIM', 'SSIM_1') reads no variable, and a
    Siamese tower applied again with reuse=True ('tower', 'tower_1') reads the same ones:
    twins.  Two dense layers ('dense', 'dense_1' with deeper names: Tensordot) are not."""
    graph = tf.Graph()
    with graph.as_default(), tf1.variable_scope("", use_resource=resource):
        a, b = (tf1.placeholder(tf.float32, [2, 16, 16, 1]) for _ in range(2))
        tf.image.ssim(a, b, max_val=255.0)
        tf.image.ssim(b, a, max_val=255.0)
        x = tf1.placeholder(tf.float32, [2, 3, 4])
        for reuse in (False, True):
            with tf1.variable_scope("tower", reuse=reuse):
                tf1.layers.dense(x, 4, name="h")
        tf1.layers.dense(tf1.layers.dense(x, 4), 4)
    every = {op.name for op in graph.get_operations()}
    depthwise = sorted(op.name for op in graph.get_operations()
                       if op.name.startswith("SSIM/") and op.type == "DepthwiseConv2dNative")[0]
    twins = twin_nodes(graph, [depthwise], every)
    assert twins[0] == "SSIM_1/" + depthwise.partition("/")[2]
    # and the same Gaussian filter over the other values, in both (weight_siblings)
    filters = {n for n in twins[1:] if graph.get_operation_by_name(n).type == "DepthwiseConv2dNative"}
    assert filters == {op.name for op in graph.get_operations() if op.type == "DepthwiseConv2dNative"
                       and op.name.partition("/")[0] in ("SSIM", "SSIM_1")} - {depthwise, twins[0]}
    # and what computes the filter they read (weight_producers), not the shapes it is tiled to
    assert {"SSIM/Tile", "SSIM_1/Tile"} <= set(twins)
    assert not any(graph.get_operation_by_name(n).type in ("Shape", "Const") for n in twins)
    assert twin_nodes(graph, ["tower/h/Tensordot/MatMul"], every) == ["tower_1/h/Tensordot/MatMul"]
    assert twin_nodes(graph, ["dense/Tensordot/MatMul"], every) == []


def test_a_culprit_found_from_a_float32_inf_is_presumed_and_said_so(caplog):
    """-log(1 - sigmoid(40)) is log(0) in float32 too: the half nodes upstream of the float32
    Log are only presumed to blame, and the warning says so."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf1.get_variable("w", initializer=np.full([8, 1], 5.0, np.float32))
        logits = tf.reshape(tf.nn.relu(tf.matmul(x, w)), [-1], name="logits")
        loss = -tf.reduce_mean(tf1.log(1.0 - tf.sigmoid(logits)))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(20):
            session.run(train_op, {x: np.ones([4, 8], np.float32)})
        first = session.heals[0]
    assert first.presumed and first.culprit == "Log:0"
    # 1 / sub, in Log's gradient, is inf of its own: a second culprit, healed with the first
    assert "presumably 'sub' (Sub, infer list), upstream of float32 'Log'" in culprit_messages(caplog)[0]


def test_a_presumed_heal_is_taken_back_once_the_inf_turns_out_float32s_own(tmp_path, caplog):
    """exp(400) is inf in float32 too: the half MatMul upstream is healed as presumed to
    blame; once float32 alone makes it, that heal is taken back -- no checkpoint saved
    afterwards lists it, nor does a later session keep it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4])
        risk = tf1.layers.dense(x, 1, kernel_initializer=tf1.constant_initializer(1.0), name="risk")
        loss = tf.reduce_mean(tf.exp(risk))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
        saver = tf1.train.Saver()
    feed = {x: np.full((8, 4), 100.0, np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(8):
            session.run(train_op, feed)
        saver.save(session, str(tmp_path / "model"))
        (heal,) = session.heals
    assert heal.presumed and "risk/MatMul" in heal.nodes
    (said,) = [r.getMessage() for r in caplog.records if "because float32 'Exp'" in r.getMessage()]
    assert "The heal of 'risk/MatMul', presumed to cause it, is taken back" in said
    assert not (tmp_path / heal_files.HEALS_BESIDE_CHECKPOINTS).exists()
    with tfamp_rewrite.Session(graph=graph) as later:
        later.run(init)
        later.run(loss, feed)
        assert later.rewrite_reports[-1].decision("risk/MatMul").converted


def test_an_inf_nan_float32_makes_of_values_no_half_tensor_computes_is_said_and_not_healed(caplog):
    """A detection loss normalised by its count of positives gives 0/0 for a batch with
    none, in float32 as much as under AMP.  Walking up from the NaN gradients past the
    unprobed float32 loss chain reached the head's half Conv2D, which was healed as the
    "presumed" culprit "whatever the loss scale"."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [4, 8, 8, 3])
        targets = tf1.placeholder(tf.float32, [4, 8, 8, 4])
        positive = tf1.placeholder(tf.float32, [4, 8, 8])
        body = tf1.layers.conv2d(images, 8, 3, padding="same", activation=tf.nn.relu, name="body")
        boxes = tf1.layers.conv2d(body, 4, 3, padding="same", name="head")
        error = tf.reduce_sum(tf.abs(boxes - targets), -1)
        loss = tf.math.truediv(tf.reduce_sum(error * positive), tf.reduce_sum(positive), name="box_loss")
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.MomentumOptimizer(0.01, 0.9), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for step in range(60):
            some = (rng.rand(4, 8, 8) < 0.1).astype(np.float32) * (step % 3 != 0)  # every 3rd: none
            session.run(train_op, {images: rng.rand(4, 8, 8, 3), targets: rng.rand(4, 8, 8, 4),
                                   positive: some})
        assert not session.heals
        weights = session.run(graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES))
    assert all(np.isfinite(w).all() for w in weights)
    said = [r.getMessage() for r in caplog.records if "turns finite values into inf/nan" in r.getMessage()]
    assert len(said) == 1
    assert ("because float32 'box_loss' (RealDiv) turns finite values into inf/nan: it divides by "
            "'Sum_2:0', which no float16 tensor computes" in said[0])
    assert "Conv2D" not in "\n".join(r.getMessage() for r in caplog.records)


def test_with_healing_off_the_warning_names_the_node_and_steps_stay_skipped(monkeypatch, caplog):
    monkeypatch.setenv(step_watch.AUTO_FIX_ENV, "0")
    parts = overflow_net()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            train(parts, session, 20)
            assert session.run(parts["global_step"]) == 0
    (message,) = culprit_messages(caplog)
    assert "'logits' (MatMul, allow list)" in message and "TFAMP_REWRITE_AUTO_FIX=0" in message
    assert session.heals == []


def scale_net():
    """loss = sum((x w)^2) / 2 with |gradients| ~ 2**11: finite at loss scales <= 2**4 only."""
    graph = tf.Graph()
    parts = {}
    with graph.as_default():
        x = tf.constant(np.full([8, 8], 8.0, np.float32))
        w = tf1.get_variable("w", initializer=np.full([8, 1], 0.5, np.float32))
        parts["loss"] = tf.reduce_sum(tf.square(tf.matmul(x, w, name="mm"))) / 2.0
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
        parts["global_step"] = tf1.train.get_or_create_global_step()
        parts["train"] = opt.minimize(parts["loss"], global_step=parts["global_step"])
        parts["init"] = tf1.global_variables_initializer()
        parts["scale"] = opt.loss_scale()
    parts["graph"] = graph
    return parts


def test_the_settled_line_after_a_heal_says_nothing_more_is_kept(caplog):
    """After a heal, a later fall of the scale with no culprit said "so nothing is kept
    float32", read in sequence as contradicting the heal before it."""
    parts = scale_net()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            session._watch.heals.append(None)  # stands for an earlier heal of this session
            train(parts, session, 24)
    (settled,) = [r.getMessage() for r in caplog.records if "fell far enough" in r.getMessage()]
    assert "so nothing more is kept float32 for them" in settled


def test_a_model_whose_right_scale_is_low_skips_its_first_steps_without_a_diagnosis(caplog):
    """No culprit, no heal; but the skips are said: the first at INFO, and once the scale has
    settled, where it settled and how to start there."""
    parts = scale_net()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            train(parts, session, 24)
            applied = session.run(parts["global_step"])
            settled = session.run(parts["scale"])
    assert 8 <= applied < 24 - 8                             # more than 2**8 of fall, then applied
    assert culprit_messages(caplog) == [] and session.heals == []
    said = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO, logging.WARNING]
    assert "a training step was skipped" in said[0].getMessage() and "32768" in said[0].getMessage()
    skipped = 24 - applied
    assert "(%d skipped steps), then steps applied at %g" % (skipped, settled) in said[1].getMessage()
    assert "DynamicLossScale(initial_loss_scale=%g)" % settled in said[1].getMessage()
    environment = "TFAMP_REWRITE_INITIAL_LOSS_SCALE=%g for the optimizers automatic" % settled
    assert environment in said[1].getMessage()


def test_automatic_loss_scaling_starts_where_the_environment_says(monkeypatch):
    """A canned Estimator's optimizer is wrapped by automatic loss scaling: the settled line's
    TFAMP_REWRITE_INITIAL_LOSS_SCALE starts it there, and no step skips; a value that is no
    scale is a one-line error naming the fix."""
    from tfamp_rewrite.training import activation

    monkeypatch.setenv("TFAMP_REWRITE_INITIAL_LOSS_SCALE", "4")
    graph = tf.Graph()
    try:
        activation.enable_loss_scaling()
        with graph.as_default():
            x = tf.constant(np.full([8, 8], 8.0, np.float32))
            w = tf1.get_variable("w", initializer=np.full([8, 1], 0.5, np.float32))
            loss = tf.reduce_sum(tf.square(tf.matmul(x, w, name="mm"))) / 2.0
            step = tf1.train.get_or_create_global_step()
            train_op = tf1.train.GradientDescentOptimizer(1e-6).minimize(loss, global_step=step)
            init = tf1.global_variables_initializer()
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(12):
                session.run(train_op)
            assert session.run(step) == 12
        monkeypatch.setenv("TFAMP_REWRITE_INITIAL_LOSS_SCALE", "a lot")
        with graph.as_default(), pytest.raises(ValueError, match=r"^TFAMP_REWRITE_INITIAL_LOSS_SCALE='a lot' "
                                                                   r"is not a number >= 1; set it to"):
            tf1.train.AdamOptimizer(1e-3).minimize(loss)
    finally:
        activation.deactivate()


def test_outlier_batches_every_other_step_are_diagnosed_and_healed(caplog):
    """Inputs of 3e5 in every other batch overflow the half MatMul: those steps skip, the
    ones between apply, and the scale sinks to its floor.  The applied steps do not hide it:
    the skips are diagnosed on a skipped step, healed, and then every step applies."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [16, 8], name="x")
        y = tf1.placeholder(tf.float32, [16, 1], name="y")
        w = tf1.get_variable("w", initializer=tf1.random_normal([8, 1], stddev=0.1, seed=1))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w, name="pred") - y))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-12), "dynamic")
        step = tf1.train.get_or_create_global_step()
        train_op = opt.minimize(loss, global_step=step)
        init = tf1.global_variables_initializer()
    applied = []
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for i in range(80):
                xs = rng.standard_normal([16, 8]).astype(np.float32) * (3e5 if i % 2 else 1.0)
                before = session.run(step)
                session.run(train_op, {x: xs, y: xs[:, :1]})
                applied.append(session.run(step) > before)
    assert session.heals and "pred" in session.heals[0].nodes
    assert "applied between them" in culprit_messages(caplog)[0]
    assert all(applied[-20:])                                # outlier batches apply too


def test_with_two_loss_scaled_optimizers_the_skip_line_names_the_step_that_skipped(caplog):
    """A GAN's two optimizers each have a loss scale: the lines say which step skipped by
    the variables it updates, not by a loss-scale variable's scope -- the first skip, and
    where that step's scale settled."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full([8, 8], 8.0, np.float32))
        losses, trains = [], []
        for scope, value in (("generator", 1e-5), ("discriminator", 0.5)):  # only the second overflows
            with tf1.variable_scope(scope):
                w = tf1.get_variable("w", initializer=np.full([8, 1], value, np.float32))
                bias = tf1.get_variable("b", initializer=np.zeros([1], np.float32))
            losses.append(tf.reduce_sum(tf.square(tf.matmul(x, w) + bias)) / 2.0)
            opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
            trains.append(opt.minimize(losses[-1], var_list=[w, bias]))
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(30):
                session.run(trains)
    (said,) = [r.getMessage() for r in caplog.records if "a training step was skipped" in r.getMessage()]
    assert "(the step updating 'discriminator/w' and 1 more variable)" in said
    (settled,) = [r.getMessage() for r in caplog.records if "fell far enough" in r.getMessage()]
    assert "training steps (those updating 'discriminator/w' and 1 more variable) were skipped" in settled


def _settled_line(monkeypatch, caplog, inputs, steps=100):
    """The settled line of a loss ``sum((x w)^2) / 2``, w = 1, trained on ``inputs(step)``
    as x: the weight gradient x^2 times the scale passes float16's range at large x."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [1, 1], name="x")
        w = tf1.get_variable("w", initializer=np.ones([1, 1], np.float32))
        loss = tf.reduce_sum(0.5 * tf.square(tf.matmul(x, w)))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-9), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for step in range(steps):
            session.run(train_op, {x: [[inputs(step)]]})
        assert not session.heals
    (settled,) = [r.getMessage() for r in caplog.records if "then steps applied at" in r.getMessage()]
    return settled


def test_a_scale_that_falls_on_rare_batches_is_not_said_to_need_a_lower_start(caplog, monkeypatch):
    """One batch in five has an input whose weight gradient overflows float16 at every scale
    above 1: the scale falls a step per such batch, the others apply between them. That is
    no initial scale too high, and no advice to start at the scale it fell to."""
    settled = _settled_line(monkeypatch, caplog, lambda step: 250.0 if step % 5 == 0 else 1.0)
    assert "skipped now and then" in settled
    assert "applied between them" in settled and "INITIAL_LOSS_SCALE" not in settled
    assert not [r for r in caplog.records if "fell far enough" in r.getMessage()]


def test_a_scale_falling_on_every_third_batch_is_said_too_high_not_sparse(caplog, monkeypatch):
    """EM routing's gradients overflowed on most batches at first: a skip every other or
    third step, the scale falling 4096-fold.  Said as skips 'now and then' from 'some
    batches only', it advised against the lower start the run needed."""
    settled = _settled_line(monkeypatch, caplog, lambda step: 100.0 if step % 3 == 0 else 1.0)
    assert "fell far enough" in settled and "skipped now and then" not in settled
    assert "initial_loss_scale=4)" in settled  # 1e4 * 4 fits float16, * 8 does not


def test_a_scale_settling_at_its_floor_is_not_said_to_need_a_lower_start(caplog, monkeypatch):
    """Gradients of 6e4 fit float16 at scale 1 only: the line advised initial_loss_scale=1 as
    if the start were the problem, and the next larger batch overflowed at the floor."""
    settled = _settled_line(monkeypatch, caplog, lambda step: 245.0, steps=40)
    assert "fell to its floor" in settled and "initial_loss_scale" not in settled


def test_a_scale_that_falls_a_few_steps_is_said_once_at_info_only(caplog):
    parts = overflow_net(input_scale=2.0)   # finite logits; gradients overflow only at the top scales
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            train(parts, session, 12)
            applied = session.run(parts["global_step"])
    said = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert 12 - 8 < applied < 12                             # a few skips, then applied
    assert [r.levelno for r in said] == [logging.INFO]


def _state(session, parts):
    """Every global variable but the loss scale's, by name."""
    with parts["graph"].as_default():
        variables = [v for v in tf1.global_variables() if not v.name.startswith("loss_scale/")]
    return dict(zip([v.name for v in variables], session.run(variables)))


@pytest.mark.parametrize("pipeline", ["queue", "dataset"])
def test_the_heal_changes_no_variable_slot_step_or_input_position(pipeline, monkeypatch):
    """Two runs from the same start, one healing and one not: at the heal they hold the same
    weights, momentum slots, global_step and next batch (all earlier steps were skipped)."""
    runs = {}
    for heals in (True, False):
        monkeypatch.setenv(step_watch.AUTO_FIX_ENV, "1" if heals else "0")
        parts = overflow_net(pipeline=pipeline)
        session = tfamp_rewrite.Session(graph=parts["graph"])
        session.run([parts["init"], parts["local_init"]])
        coordinator = tf1.train.Coordinator()
        with parts["graph"].as_default():
            runners = tf1.train.start_queue_runners(session, coord=coordinator)
        for step in range(30):
            session.run(parts["train"])
            if session.heals or (not heals and step == runs[True]["steps"] - 1):
                break
        runs[heals] = {"steps": step + 1, "state": _state(session, parts),
                       "scale": session.run(parts["scale"]), "heals": len(session.heals),
                       "next_batch": session.run(parts["batch"])}
        coordinator.request_stop()
        coordinator.join(runners, stop_grace_period_secs=10)
        session.close()
    healed, plain = runs[True], runs[False]
    assert healed["heals"] == 1 and plain["heals"] == 0 and healed["steps"] == plain["steps"]
    assert healed["state"].keys() == plain["state"].keys()
    assert any("Momentum" in name for name in healed["state"])   # the optimizer's slots
    for name, value in healed["state"].items():
        np.testing.assert_array_equal(value, plain["state"][name], err_msg=name)
    np.testing.assert_array_equal(healed["next_batch"], plain["next_batch"])  # the same position
    assert healed["scale"] == INITIAL_SCALE and plain["scale"] < INITIAL_SCALE


def test_a_heal_file_is_written_and_a_new_session_starts_healed(tmp_path, monkeypatch, caplog):
    path = tmp_path / "heals.json"
    monkeypatch.setenv(heal_memory.HEAL_FILE_ENV, str(path))
    parts = overflow_net()
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 12)
    assert session.heals
    def strict(constant):
        raise ValueError("not strict JSON: " + constant)

    written = json.loads(path.read_text(), parse_constant=strict)
    assert "logits" in written["kept_float32"] and written["heals"][0]["culprit"] == "logits:0"
    again = overflow_net()
    caplog.clear()
    monkeypatch.setattr(devices, "_logged", set())
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=again["graph"]) as session:
            session.run(again["init"])
            losses = train(again, session, 3)
    assert session.rewrite_reports[0].decision("logits").dtype == "float32"
    assert np.isfinite(losses[0]) and session.heals == [] and culprit_messages(caplog) == []
    listed = len(written["kept_float32"])
    (line,) = [r.getMessage() for r in caplog.records if "node(s) to keep float32" in r.getMessage()]
    assert "lists %d node(s)" % listed in line and "this graph holds %d of them" % listed in line
    # A serving graph holds some of them, or none: the line counts what it holds.
    monkeypatch.setattr(devices, "_logged", set())
    serving = tf.Graph()
    with serving.as_default():
        tf1.placeholder(tf.float32, [2], name="x")
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        tfamp_rewrite.Session(graph=serving).close()
    assert "this graph holds none of them" in caplog.text


@pytest.mark.parametrize("sharded, remote", [(False, False), (True, False), (False, True)],
                         ids=["saver", "sharded_saver", "saver_on_a_remote_file_system"])
def test_a_checkpoint_saved_after_a_heal_carries_it_to_a_session_restoring_it(tmp_path, monkeypatch,
                                                                           caplog, sharded, remote):
    """An evaluation in another process restores the checkpoint: the heals written beside it
    keep its overflowing node float32 from its first run; without them that run returns inf.
    Remote: a directory TensorFlow's file systems reach and Python's do not (``ram://``
    standing in for an Estimator's ``gs://`` model_dir)."""
    if remote:
        directory = "ram://tfamp-heals-%s/ckpt" % tmp_path.name
        try:
            tf.io.gfile.makedirs(directory)
        except tf.errors.OpError as error:
            pytest.skip("this TensorFlow has no ram:// file system to stand in for gs:// (%s)"
                        % error.message)
    else:
        directory = str(tmp_path / "ckpt")
        os.mkdir(directory)
    parts = overflow_net()
    with parts["graph"].as_default():
        saver = tf1.train.Saver(sharded=sharded)
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 12)
        prefix = saver.save(session, directory + "/model", global_step=12)
    assert session.heals
    beside = directory + "/" + heal_files.HEALS_BESIDE_CHECKPOINTS
    kept = json.loads(tf.io.gfile.GFile(beside).read())["kept_float32"]
    assert "logits" in kept

    def evaluate():
        monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # another process
        monkeypatch.setattr(devices, "_logged", set())
        again = overflow_net()
        with again["graph"].as_default():
            restorer = tf1.train.Saver(sharded=sharded)
        with tfamp_rewrite.Session(graph=again["graph"]) as evaluation:
            restorer.restore(evaluation, prefix)
            feed = {again["batch"]: next(iter(again["feed"].values()))}
            return evaluation.run("logits:0", feed)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        logits = evaluate()
    assert np.isfinite(logits).all() and np.abs(logits).max() > 65504  # float32 from the first run
    (line,) = [r.getMessage() for r in caplog.records if "restored a checkpoint" in r.getMessage()]
    assert "kept %d node(s) float32" % len(kept) in line
    assert not [name for name in tf.io.gfile.listdir(directory) if name.startswith(".tfamp-heals-")]
    tf.io.gfile.remove(beside)
    assert not np.isfinite(evaluate()).all()  # the proof: without them, float16 overflows


def test_a_frozen_graph_imported_under_a_scope_starts_healed_in_the_same_process(monkeypatch, caplog):
    """Training heals 'logits'; the program freezes the session's graph and serves it with
    ``import_graph_def`` (its default scope, "import/"): the remembered heal matched names
    exactly, so the served graph overflowed again, and a serving loop returned inf."""
    parts = overflow_net()
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 12)
        assert session.heals
        frozen = tf1.graph_util.convert_variables_to_constants(
            session, parts["graph"].as_graph_def(), ["logits"])
    monkeypatch.setattr(devices, "_logged", set())
    batch = next(iter(parts["feed"].values()))
    served = tf.Graph()
    with served.as_default():
        tf1.import_graph_def(frozen)
    with tfamp_rewrite.Session(graph=served) as serving:
        logits = serving.run("import/logits:0", {"import/x:0": batch})
    assert np.isfinite(logits).all() and np.abs(logits).max() > 65504  # float32 from the first run
    monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # the proof: another process overflows
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=served) as serving:
        assert not np.isfinite(serving.run("import/logits:0", {"import/x:0": batch})).all()
        for _ in range(3):
            serving.run("import/logits:0", {"import/x:0": batch})
    # its heal keeps the frozen weights' reads float32 too: no layer elsewhere
    (healed,) = [r.getMessage() for r in caplog.records
                 if r.getMessage().startswith("tfamp_rewrite: healed: 'import/")]
    assert "the same layer" not in healed and "computing the weights" in healed, healed
    assert "read (from constants and variables)" in healed


def test_a_saved_model_loaded_under_an_import_scope_keeps_its_heals(tmp_path, monkeypatch):
    """``loader.load(session, tags, path, import_scope="served")``: the heals written beside
    the SavedModel's variables named the training graph's nodes, which the scoped graph
    holds as 'served/logits': it started unhealed and served inf."""
    parts = overflow_net()
    export = str(tmp_path / "model")
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 12)
        assert session.heals
        with parts["graph"].as_default():
            tf1.saved_model.simple_save(session, export, {"x": parts["batch"]},
                                        {"logits": parts["graph"].get_tensor_by_name("logits:0")})
    monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # another process
    batch = next(iter(parts["feed"].values()))
    with tf.Graph().as_default() as graph, tfamp_rewrite.Session(graph=graph) as serving:
        tf1.saved_model.loader.load(serving, ["serve"], export, import_scope="served")
        logits = serving.run("served/logits:0", {"served/x:0": batch})
    assert np.isfinite(logits).all() and np.abs(logits).max() > 65504


def _model_under(scope: str):
    """The PTB tutorial's layout: the model's ops under name_scope(scope), its variables
    under variable_scope("Model"), shared by the Train and Test models."""
    x = tf1.placeholder(tf.float32, [None, 8], name="x")
    with tf.name_scope(scope), tf1.variable_scope("Model", reuse=tf1.AUTO_REUSE):
        return x, tf1.layers.dense(x, 1, kernel_initializer=tf1.constant_initializer(20000.0), name="out")


@pytest.mark.parametrize("carried_by", ["process", "checkpoint"])
def test_a_test_model_under_another_name_scope_starts_with_the_train_models_heals(
        tmp_path, monkeypatch, carried_by):
    """The Train model healed 'Train/Model/out/MatMul'; the Test model, built in a new graph
    under 'Test/' on the same variables, matched no healed name and predicted inf."""
    inputs, targets = np.ones([4, 8], np.float32), np.full([4, 1], 160000.0, np.float32)
    with tf.Graph().as_default() as graph:
        x, prediction = _model_under("Train")
        y = tf1.placeholder(tf.float32, [None, 1], name="y")
        loss = tf1.losses.mean_squared_error(y, prediction)
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
        step = optimizer.minimize(loss)
        saver = tf1.train.Saver()
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            for _ in range(6):
                session.run(step, {x: inputs, y: targets})
            assert any("Train/Model/out/MatMul" in h.nodes for h in session.heals)
            path = saver.save(session, str(tmp_path / "model"))
    if carried_by == "checkpoint":
        monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # another process
    with tf.Graph().as_default() as graph:
        x, prediction = _model_under("Test")
        with tfamp_rewrite.Session(graph=graph) as session:
            tf1.train.Saver().restore(session, path)
            predicted = session.run(prediction, {x: inputs})
    np.testing.assert_allclose(predicted, 160000.0, rtol=1e-3)


def test_the_same_layer_elsewhere_reads_the_same_variables_not_its_own():
    """'generator/dense/MatMul' is not 'discriminator/dense/MatMul': each scope holds its
    own variables; 'Test/Model/out/MatMul' is 'Train/Model/out/MatMul', both reading
    'Model/out/kernel'."""
    with tf.Graph().as_default() as graph:
        x = tf1.placeholder(tf.float32, [None, 8])
        for scope in ("generator", "discriminator"):
            with tf1.variable_scope(scope):
                tf1.layers.dense(x, 1, name="dense")
        _model_under("Test")
    assert heal_memory.same_layer_elsewhere(graph, "critic/dense/MatMul") == []
    assert heal_memory.same_layer_elsewhere(graph, "Train/Model/out/MatMul") == ["Test/Model/out/MatMul"]


def test_a_resumed_run_writes_the_heals_it_restored_beside_its_own_checkpoints(tmp_path, monkeypatch):
    """A resumed process keeps the restored nodes float32 and heals nothing itself: the heal
    file it wrote beside its checkpoints listed the nodes, but 'heals': [] -- what was healed,
    and why, was lost after one resume."""
    _, prefix = healed_checkpoint(str(tmp_path / "first" / "model"))
    (healed,) = json.loads((tmp_path / "first" / heal_files.HEALS_BESIDE_CHECKPOINTS).read_text())["heals"]
    monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # another process
    again = overflow_net()
    with again["graph"].as_default():
        resaver = tf1.train.Saver()
    with tfamp_rewrite.Session(graph=again["graph"]) as resumed:
        resaver.restore(resumed, prefix)
        train(again, resumed, 4)
        assert resumed.heals == []
        resaver.save(resumed, str(tmp_path / "second" / "model"))
    written = json.loads((tmp_path / "second" / heal_files.HEALS_BESIDE_CHECKPOINTS).read_text())
    assert written["heals"] == [healed] and "logits" in written["kept_float32"]


@pytest.mark.skipif(not hasattr(tf1, "estimator"), reason="this TensorFlow has no Estimator (gone in 2.16)")
def test_an_estimator_export_says_where_its_heals_end_up_not_its_temporary_directory(tmp_path, caplog):
    """An Estimator writes its SavedModel to <base>/temp-<timestamp> and renames it: the line
    names the heal file where a server loads it from."""
    from tfamp_rewrite.training import activation

    inputs = (np.random.RandomState(0).standard_normal([16, 32]) * 2000.0).astype(np.float32)

    def model_fn(features, labels, mode):
        w1 = tf1.get_variable("w1", initializer=tf1.random_normal([32, 64], stddev=1.0, seed=1))
        w2 = tf1.get_variable("w2", initializer=tf1.random_normal([64, 4], stddev=1.0, seed=2))
        logits = tf.matmul(tf.nn.relu(tf.matmul(features["x"], w1)), w2, name="logits")
        if mode == tf1.estimator.ModeKeys.PREDICT:
            return tf1.estimator.EstimatorSpec(mode, predictions={"logits": logits})
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.MomentumOptimizer(1e-9, 0.9), "dynamic")
        return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
            loss, global_step=tf1.train.get_or_create_global_step()))

    def input_fn():
        return tf1.data.Dataset.from_tensors(({"x": inputs}, np.zeros(16, np.int32))).repeat()

    def serving_input_fn():
        x = tf1.placeholder(tf.float32, [None, 32], name="x")
        return tf1.estimator.export.ServingInputReceiver({"x": x}, {"x": x})

    activation.enable_graph_rewrite()
    try:
        with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
            estimator = tf1.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
            estimator.train(input_fn, max_steps=2)
            exported = estimator.export_saved_model(str(tmp_path / "export"), serving_input_fn)
    finally:
        activation.deactivate()
    exported = exported.decode() if isinstance(exported, bytes) else exported
    beside = os.path.join(exported, "variables", heal_files.HEALS_BESIDE_CHECKPOINTS)
    assert "logits" in json.loads(open(beside).read())["kept_float32"]
    (line,) = [r.getMessage() for r in caplog.records
               if "in the SavedModel an Estimator exports" in r.getMessage()]
    assert line.startswith("tfamp_rewrite: %s, in the SavedModel" % beside)
    assert "temp-%s" % os.path.basename(exported) in line and "which it then renames" in line


def test_the_fix_a_warning_gives_keeps_the_node_float32_from_the_first_step(monkeypatch, caplog):
    """The warning's TFAMP_REWRITE_NODES_TO_EXCLUDE, set in the next run, keeps the culprit
    float32 from its first step: its loss is finite, nothing is named or healed; said once."""
    parts = overflow_net()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            train(parts, session, 3)
    (message,) = culprit_messages(caplog)
    setting = re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", message).group(1)
    monkeypatch.setenv("TFAMP_REWRITE_NODES_TO_EXCLUDE", setting + ",^no_such_node$")
    monkeypatch.setattr(devices, "_logged", set())
    monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # the next run: a new process
    caplog.clear()
    again = overflow_net()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=again["graph"]) as session:
            session.run(again["init"])
            losses = train(again, session, 3)
            decision = session.rewrite_reports[-1].decision("logits")
    assert np.isfinite(losses).all() and session.heals == [] and decision.dtype == "float32"
    assert culprit_messages(caplog) == []
    (said,) = [r.getMessage() for r in caplog.records if "float32 by name" in r.getMessage()]
    assert "keeps 1 node(s)" in said and "'^no_such_node$' matches none of them" in said


def test_nodes_to_exclude_given_to_a_session_and_a_bad_pattern(monkeypatch):
    parts = overflow_net()
    with tfamp_rewrite.Session(graph=parts["graph"], nodes_to_exclude=["^logits$"]) as session:
        session.run(parts["init"])
        assert np.isfinite(train(parts, session, 2)).all() and session.heals == []
    monkeypatch.setenv("TFAMP_REWRITE_NODES_TO_EXCLUDE", "^logits$,dense[")
    with pytest.raises(ValueError, match=r"TFAMP_REWRITE_NODES_TO_EXCLUDE: 'dense\[' is not a regular "
                                         r"expression .*comma-separated$"):
        tfamp_rewrite.Session(graph=parts["graph"])


def test_a_pattern_that_matches_no_node_is_said_even_alone(caplog):
    """'^nope$' beside a pattern that matched was named; alone, it kept nothing, unsaid."""
    parts = overflow_net()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"], nodes_to_exclude=["^nope$"]) as session:
            session.run(parts["init"])
    (line,) = [r.getMessage() for r in caplog.records if "matches no node" in r.getMessage()]
    assert "'^nope$' matches no node of the session graph (yet)" in line and "e.g. '" in line


def test_a_session_keeping_nothing_float32_writes_nothing_beside_its_checkpoints(tmp_path, caplog):
    parts = overflow_net(input_scale=1.0)
    with parts["graph"].as_default():
        saver = tf1.train.Saver()
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 2)
        saver.save(session, str(tmp_path / "model"))
        (tmp_path / heal_files.HEALS_BESIDE_CHECKPOINTS).write_text("not json")
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            saver.restore(session, str(tmp_path / "model"))  # a damaged file: said, then ignored
            assert np.isfinite(train(parts, session, 1)).all()
    assert session.heals == [] and sorted(p.name for p in tmp_path.iterdir() if "heals" in p.name) == \
        [heal_files.HEALS_BESIDE_CHECKPOINTS]
    (line,) = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert "delete the file" in line


def test_a_callable_made_from_options_is_diagnosed_and_healed(caplog):
    """Keras in TF1 graph mode trains through callables made from options: a step due a
    diagnosis is made as a run, the heal remakes the callable, and training goes on."""
    parts = overflow_net()
    (x, y), values = zip(*parts["feed"].items())
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            train_step = session._make_callable_from_options(config_pb2.CallableOptions(
                feed=[x.name, y.name], fetch=[parts["loss"].name], target=[parts["train"].name]))
            losses = [train_step(*values)[0] for _ in range(40)]
            global_step = session.run(parts["global_step"])
    (message,) = culprit_messages(caplog)
    assert "'logits' (MatMul, allow list)" in message and "heal 1 of at most 16" in message
    assert session.heals and session.heals[0].culprit == "logits:0"
    assert not np.isfinite(losses[0]) and np.isfinite(losses[-10:]).all() and global_step > 0


def test_one_heal_keeps_the_clear_chain_that_passes_a_large_value_on(caplog):
    """Inputs of 1e5 reshaped and transposed before a MatMul: the reshape, the transpose and
    the MatMul all read the value in half, and one heal keeps all three float32, where
    keeping the first alone would move the overflow one node on per heal."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4, 4], name="x")
        w = tf1.get_variable("w", initializer=tf1.random_normal([16, 2], stddev=1e-3, seed=1))
        flat = tf.transpose(tf.reshape(x, [8, 16], name="flat"), name="columns")
        out = tf.matmul(flat, tf1.random_normal([8, 2], seed=2), name="mix")
        loss = tf.reduce_mean(tf.matmul(out * 1e-5, tf.ones([2, 16])) @ w)
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: (rng.standard_normal([8, 4, 4]) * 1e5).astype(np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(40):
                session.run(train_op, feed)
    (heal,) = session.heals
    assert heal.culprit == "x:0" and {"flat", "columns", "mix"} <= set(heal.nodes), heal.nodes


def style_loss_net(layers=5, seed=0):
    """A style-transfer loss: a chain of ReLU layers over an image's features, and each
    layer's Gram matrix (MatMul, allow list: about 1.2e5, beyond float16) compared with a
    target's.  No Gram matrix is computed from another, so each overflows on its own."""
    rng = np.random.RandomState(seed)
    graph = tf.Graph()
    parts = {"graph": graph, "grams": ["gram%d" % i for i in range(layers)]}
    with graph.as_default():
        value = (rng.rand(64, 16) * 10).astype(np.float32)
        image = tf1.get_variable("image", initializer=value)
        features, loss = image, 0.0
        for i in range(layers):
            w = np.abs(rng.standard_normal([16, 16])).astype(np.float32) / 4
            value = np.maximum(value @ w, 0)
            features = tf.nn.relu(tf.matmul(features, w), name="features%d" % i)
            scale = np.sqrt(1.2e5 / (value.T @ value).max()).astype(np.float32)
            gram = tf.matmul(features * scale, features * scale, transpose_a=True, name="gram%d" % i)
            loss += tf.reduce_mean(tf.square(gram * 1e-5 - 1.0))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
        parts["loss"], parts["train"] = loss, opt.minimize(loss)
        parts["init"] = tf1.global_variables_initializer()
    return parts


def test_every_independent_culprit_of_a_step_is_healed_at_once(caplog):
    """Five Gram matrices that each overflow: one warning names them all and one heal keeps
    them all float32 -- one loss-scale restart and one more graph, not five."""
    parts = style_loss_net()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            losses = train(parts, session, 40)
    (heal,) = session.heals
    healed = {heal.culprit} | set(heal.more_culprits)
    assert healed == {g + ":0" for g in parts["grams"]}, healed
    assert set(parts["grams"]) <= set(heal.nodes)
    (message,) = culprit_messages(caplog)
    assert "The cause is 5 tensors that do not fit float16" in message
    assert "'gram0' (MatMul, allow list)" in message and "and 1 more" in message
    assert "Keep them float32" in message and "keeps them float32 from now on (heal 1 of" in message
    assert not np.isfinite(losses[0]) and np.isfinite(losses[-5:]).all()
    reports = session.rewrite_reports[-1]
    assert all(reports.decision(g).dtype == "float32" for g in parts["grams"])


def test_a_chain_of_gradients_too_large_at_any_scale_is_healed_without_restarting_the_scale(caplog):
    """A loss weighted 1e5 (style transfer's) sends gradients past 65504 back through every
    conv: each heal keeps one more layer's backprop float32.  The first heal restarts the
    scale; those after it, healing the same chain further, leave it where it is -- a
    restart costs a fall of many skipped steps per layer where the culprit hides behind
    other overflows at high scales."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 8, 8, 4], name="x")
        h = x
        for i in range(4):
            kernel = tf1.get_variable("w%d" % i, initializer=tf1.truncated_normal_initializer(
                stddev=0.3, seed=i), shape=[3, 3, 4, 4])
            h = tf.nn.relu(tf.nn.conv2d(h, kernel, [1, 1, 1, 1], "SAME"))
        loss = 1e5 * tf.reduce_sum(h)
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        init = tf1.global_variables_initializer()
    data = np.random.RandomState(0).rand(2, 8, 8, 4).astype(np.float32)
    parts = dict(graph=graph, train=train_op, loss=loss, feed={x: data})
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            losses = train(parts, session, 40)
            heals = session.heals
    healed = [r.getMessage() for r in caplog.records if "tfamp_rewrite: healed:" in r.getMessage()]
    assert len(heals) >= 3 and all(h.gradients_only for h in heals)
    assert "restarts from its initial value" in healed[0]
    assert all("the loss scale stays where it is" in line for line in healed[1:])
    episodes = [r.getMessage() for r in caplog.records if "are being skipped" in r.getMessage()]
    assert "loss scale 32768 -> 16384 (" in episodes[1]  # restarted after the first heal
    assert "loss scale 32768" not in episodes[2]          # not after the second
    assert np.isfinite(losses[-5:]).all()


def test_one_heal_keeps_the_half_readers_past_a_float32_sum():
    """A MatMul of about 1e5, summed in float32 (an Exp, deny list, feeds the sum) and read in
    half by the next MatMul: one heal keeps both MatMuls float32, where keeping the first
    alone would leave the second to overflow and take a heal of its own."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 16], name="x")
        w1 = tf1.get_variable("w1", initializer=tf1.random_normal([16, 16], stddev=50.0, seed=1))
        w2 = tf1.get_variable("w2", initializer=tf1.random_normal([16, 4], stddev=1e-3, seed=2))
        first = tf.matmul(x, w1, name="first")
        summed = tf.add_n([first, tf.exp(tf.zeros([8, 16]))], name="summed")
        loss = tf.reduce_mean(tf.square(tf.matmul(summed, w2, name="second")))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-9), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: (np.random.RandomState(0).standard_normal([8, 16]) * 1e3).astype(np.float32)}
    with tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        assert session.rewrite_reports[0].decision("summed").dtype == "float32"
        for _ in range(12):
            session.run(train_op, feed)
    heal = session.heals[0]
    assert heal.culprit == "first:0" and {"first", "second"} <= set(heal.nodes), heal.nodes


def test_a_graph_that_grows_every_step_after_a_heal_adds_its_new_nodes_only():
    """An op made inside the training loop (sess.run([train, tf.reduce_max(h)])) grows the
    graph every step.  After a heal its new nodes join the healed generation: the private
    graph grows by them, not by a copy of the whole model per step, and they compute what
    they would compute in the healed graph."""
    parts = overflow_net()
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 12)
        assert session.heals
        sizes, largest = [], []
        for _ in range(6):
            with parts["graph"].as_default():
                grown = tf.reduce_max(tf.abs(parts["graph"].get_tensor_by_name("logits:0")))
            largest.append(session.run([parts["train"], grown], parts["feed"])[1])
            sizes.append(len(session._shadow.graph.get_operations()))
        logits = session.run("logits:0", parts["feed"])
    assert max(np.diff(sizes)) < 40, sizes                  # a few nodes per step
    assert np.isfinite(largest).all() and largest[-1] > 65504   # float32, as healed
    np.testing.assert_allclose(largest[-1], np.abs(logits).max(), rtol=1e-3)


def test_sessions_made_after_a_heal_start_healed(caplog):
    """An Estimator's evaluation and its next train() open new sessions on new graphs of the
    same names: they keep what the first session healed, and say so once."""
    parts = overflow_net()
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 12)
    assert session.heals
    caplog.clear()
    for _ in range(2):
        again = overflow_net()
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            with tfamp_rewrite.Session(graph=again["graph"]) as later:
                later.run(again["init"])
                losses = train(again, later, 3)
        assert later.rewrite_reports[0].decision("logits").dtype == "float32"
        assert np.isfinite(losses).all() and later.heals == [] and culprit_messages(caplog) == []
    (carried,) = [r.getMessage() for r in caplog.records
                  if "sessions made after a heal keep the healed nodes" in r.getMessage()]
    assert "this one keeps %d ('" % len(session.heals[0].nodes) in carried and "'logits'" in carried
    other = tf.Graph()  # another model that merely reuses the name
    with other.as_default():
        tf.matmul(tf1.placeholder(tf.float32, [2, 3]), tf.ones([3, 2]), name="logits")
    with tfamp_rewrite.Session(graph=other) as unrelated:
        unrelated.run("logits:0", {"Placeholder:0": np.ones([2, 3], np.float32)})
    assert unrelated.rewrite_reports[0].decision("logits").dtype == "float16"


def test_steps_inside_a_tf1_while_loop_are_said_to_be_unwatched(caplog):
    """Their finite flag cannot be fetched: one warning (in all sessions) says the skips go
    unseen, and no run is called one that 'computed no loss-scaled step'."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf.constant(np.full([4, 8], 3e3, np.float32))
        w = tf1.get_variable("w", initializer=tf1.ones([8, 4]) * 8.0)
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-9))

        def trained_loss():
            loss = tf.reduce_mean(tf.matmul(x, w, name="logits"))  # 9.6e4: inf in float16
            with tf.control_dependencies([optimizer.minimize(loss)]):
                return tf.identity(loss)

        fetch = tf1.while_loop(lambda i, _: i < 2, lambda i, _: (i + 1, trained_loss()), [0, 0.0])[1]
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        for _ in range(2):  # Estimator.train calls, a resumed MonitoredTrainingSession: once in all
            with tfamp_rewrite.Session(graph=graph) as session:
                session.run(init)
                for _ in range(3):
                    assert not np.isfinite(session.run(fetch))
    said = [r.getMessage() for r in caplog.records if "inside a TF1 tf.while_loop" in r.getMessage()]
    assert len(said) == 1 and "not said, diagnosed or healed" in said[0]
    assert "computed no loss-scaled step" not in caplog.text


def test_a_step_applied_in_a_tf1_cond_every_other_run_is_watched_and_healed(caplog):
    """Gradient accumulation applied every N-th run inside tf.cond: the step's flag and scale
    are passed out of the cond, so its skips are seen (runs whose branch is not taken count
    as no step), diagnosed from the probes the run computes, and healed."""
    parts = overflow_net()
    graph = parts["graph"]
    with graph.as_default(), control_flow_v1():
        runs = tf1.get_variable("runs", initializer=0, trainable=False)
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-9))
        apply_now = tf.equal(tf1.assign_add(runs, 1) % 2, 0)
        train = tf1.cond(apply_now, lambda: optimizer.minimize(parts["loss"]), tf.no_op)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            losses = [session.run([train, parts["loss"]], parts["feed"])[1] for _ in range(60)]
    assert not [r for r in caplog.records if "cannot be fetched" in r.getMessage()]
    (heal,) = session.heals
    assert heal.culprit == "logits:0"
    assert not np.isfinite(losses[0]) and np.isfinite(losses[-5:]).all()


def test_a_whole_step_built_inside_a_tf1_cond_is_watched_without_fetching_its_branch(caplog):
    """Forward pass and minimize both inside the cond: the gradients' Merges there (TF1's
    cond_grad) are not fetchable, so the diagnosis leaves them out instead of failing the
    run ('Retval does not have value'); its skips are still seen."""
    parts = overflow_net()
    graph = parts["graph"]
    with graph.as_default(), control_flow_v1():
        runs = tf1.get_variable("runs", initializer=0, trainable=False)
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-9))

        def step():
            logits = tf.matmul(tf.nn.relu(tf.matmul(parts["batch"], tf1.get_variable("w1"))),
                               tf1.get_variable("w2"), name="inner_logits")
            loss = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(
                labels=graph.get_tensor_by_name("y:0"), logits=logits))
            return optimizer.minimize(loss)

        with tf1.variable_scope("", reuse=True):
            train = tf1.cond(tf.equal(tf1.assign_add(runs, 1) % 2, 0), step, tf.no_op)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(40):
                session.run(train, parts["feed"])
    assert [r for r in caplog.records if "a training step was skipped" in r.getMessage()]


def test_a_heal_file_stays_strict_json_when_a_culprit_held_inf(tmp_path):
    import types

    path = tmp_path / "heals.json"
    watch = step_watch.StepWatch(types.SimpleNamespace(kept_float32={"logits"}), auto_fix=True,
                                 heal_file=str(path))
    watch.heals.append(step_watch.Heal(nodes=["logits"], culprit="logits:0", op="MatMul", held_by="",
                                       role="forward", max_abs=float("inf"), trajectory="", env=""))
    watch._write_heal_file()

    def strict(constant):
        raise ValueError("not strict JSON: " + constant)

    assert json.loads(path.read_text(), parse_constant=strict)["heals"][0]["max_abs"] is None


def test_heals_stop_at_the_limit_with_a_last_warning(monkeypatch, caplog):
    monkeypatch.setattr(step_watch, "DEFAULT_MAX_HEALS", 0)
    parts = overflow_net()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            train(parts, session, 14)
    messages = [r.getMessage() for r in caplog.records]
    (last,) = [m for m in messages if "(the limit)" in m]
    assert session.heals == [] and "run again with %s=path set" % heal_memory.HEAL_FILE_ENV in last


def test_fp32_sessions_are_not_watched():
    parts = overflow_net()
    with TF_SESSION_CLASSES["Session"](graph=parts["graph"]) as session:
        session.run(parts["init"])
        assert all(np.isfinite(train(parts, session, 2)))


def test_the_monitor_writes_tensorboard_scalars_every_nth_step(tmp_path, monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_MONITOR", "2")
    monkeypatch.setenv("TFAMP_REWRITE_MONITOR_DIR", str(tmp_path))
    parts = overflow_net()
    with tfamp_rewrite.Session(graph=parts["graph"]) as session:
        session.run(parts["init"])
        train(parts, session, 20)
    scalars = {}
    for path in tmp_path.glob("events.out.tfevents.*"):
        for event in tf1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    # global_step as each sampled step left it: 14 steps skipped, then 6 applied.  (Read in
    # the step's own run, a resource variable's value came before or after the increment.)
    steps = [step for step, _ in scalars["tfamp/skipped_steps"]]
    shown = str({tag: values for tag, values in scalars.items() if tag.count("/") == 1})
    assert steps == [0] * 7 + [2, 4, 6], shown
    # 2 skipped before the heal (the loss itself NaN), then the restarted scale falls again
    assert [v for _, v in scalars["tfamp/skipped_steps"]] == [2, 4, 6, 8, 10, 12, 14, 14, 14, 14]
    assert [v for _, v in scalars["tfamp/heals"]] == [0] + [1] * 9                  # healed at step 2
    assert scalars["tfamp/loss_scale"][1][1] == 2.0 ** 14          # the 4th step's, restarted at the 3rd
    assert scalars["tfamp/overflow_share/logits"][0][1] > 0                         # inf in half
    assert any(tag.startswith("tfamp/flush_share/") for tag in scalars)


@pytest.mark.parametrize("auto_fix,checkpoints", [("1", False), ("0", False), ("1", True)])
def test_a_nan_loss_hook_waits_while_the_session_heals_and_stops_when_it_cannot(monkeypatch, caplog,
                                                                                tmp_path, auto_fix,
                                                                                checkpoints):
    """Every Estimator adds NanTensorHook(loss): a float16 forward overflow makes the loss NaN
    from the first step, long before the heal.  The hook lets NaN losses of skipped steps pass
    while the session can still act, and stops training as usual once it cannot.  With a
    checkpoint_dir (as every Estimator has), the StepCounterHook and CheckpointSaverHook before
    it run the session again (global_step) between the step and the NanTensorHook."""
    from tfamp_rewrite.training import activation

    monkeypatch.setenv(step_watch.AUTO_FIX_ENV, auto_fix)
    parts = overflow_net()
    with parts["graph"].as_default():
        hooks = [tf1.train.NanTensorHook(parts["loss"])]
    activation.enable_graph_rewrite()
    losses = []
    directory = dict(checkpoint_dir=str(tmp_path), save_checkpoint_steps=5, log_step_count_steps=1,
                     save_summaries_steps=None) if checkpoints else {}
    try:
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            with parts["graph"].as_default(), \
                    tf1.train.MonitoredTrainingSession(hooks=hooks, **directory) as session:
                for _ in range(30):
                    losses.append(session.run([parts["train"], parts["loss"]], parts["feed"])[1])
        stopped = None
    except tf1.train.NanLossDuringTrainingError as error:
        stopped = error
    finally:
        activation.deactivate()
    # Ours only: TensorFlow's own deprecation notice for NanTensorHook names it too, once per process.
    said = [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("tfamp_rewrite: NanTensorHook")]
    assert len(said) == 1 and "its optimizer applied no update" in said[0]
    assert not np.isfinite(losses[0])
    if auto_fix == "1":
        assert stopped is None and len(losses) == 30 and np.isfinite(losses[-1])
        assert any("healed:" in r.getMessage() for r in caplog.records)
    else:  # named (the loss NaN: on the second step), cannot heal: the hook stops training then
        assert stopped is not None and 1 <= len(losses) <= 3
        (message,) = culprit_messages(caplog)
        assert "healing is off" in message


def test_a_nan_loss_hook_stops_a_run_whose_loss_is_inf_in_float32_too(caplog):
    """exp of a pre-activation of 400 is inf in float32 too: float32 applies the inf
    gradients, its loss is NaN a step later and the hook stops it.  Loss scaling skips
    every step, so the loss stays inf and global_step 0: StopAtStepHook never fired and
    the loop ran for ever.  Once the session can do nothing more, the hook stops it."""
    from tfamp_rewrite.training import activation

    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full((8, 4), 100.0, np.float32))
        hidden = tf1.layers.dense(x, 1, kernel_initializer=tf1.constant_initializer(1.0))
        loss = tf.reduce_mean(tf.exp(hidden))
        global_step = tf1.train.get_or_create_global_step()
        activation.enable_graph_rewrite()
        activation.enable_loss_scaling()   # zero-code: the optimizer is wrapped
        train_op = tf1.train.AdamOptimizer(1e-3).minimize(loss, global_step=global_step)
        hooks = [tf1.train.StopAtStepHook(last_step=5), tf1.train.NanTensorHook(loss)]
    assert _runs_until_the_nan_hook_stops(caplog, graph, [train_op, loss], hooks, most=50) < 10
    assert any("NanTensorHook: the loss was inf in a skipped step" in r.getMessage() for r in caplog.records)


def _runs_until_the_nan_hook_stops(caplog, graph, fetches, hooks, most: int) -> int:
    """Runs ``fetches`` in a MonitoredTrainingSession with ``hooks`` (zero-code AMP on) until
    NanTensorHook raises, as it must before ``most`` runs; returns how many ran."""
    from tfamp_rewrite.training import activation

    runs = 0
    try:
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), pytest.raises(
                tf1.train.NanLossDuringTrainingError):
            with graph.as_default(), tf1.train.MonitoredTrainingSession(
                    hooks=hooks, save_summaries_steps=None, log_step_count_steps=None) as session:
                while not session.should_stop() and runs < most:
                    runs += 1
                    session.run(fetches)
    finally:
        activation.deactivate()
    return runs


def test_a_nan_loss_hook_stops_a_run_whose_gradients_float32_makes_nan(caplog):
    """A UMAP-like loss with pow(d, b) of a distance 0: the loss is finite, its gradient NaN
    in float32.  Float32 applies it, its loss is NaN a step later and NanTensorHook raises;
    loss scaling skipped every step, the loss stayed finite, and StopAtStepHook ended the run
    quietly at global_step 0 with the program reporting success."""
    from tfamp_rewrite.training import activation

    graph = tf.Graph()
    with graph.as_default():
        start = np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 0.0]], np.float32)  # two points alike
        points = tf1.get_variable("points", initializer=start)
        distances = tf.reduce_sum(tf.square(points[:, None] - points[None]), -1)
        loss = tf.reduce_mean(1.0 / (1.0 + tf.pow(distances, 0.8)))  # d = 0: a NaN gradient
        global_step = tf1.train.get_or_create_global_step()
        activation.enable_graph_rewrite()
        activation.enable_loss_scaling()
        train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)
        hooks = [tf1.train.StopAtStepHook(last_step=200), tf1.train.NanTensorHook(loss)]
    _runs_until_the_nan_hook_stops(caplog, graph, [train_op, loss], hooks, most=300)
    assert any("skipped for good on inf/nan that float32 computes itself" in r.getMessage()
               for r in caplog.records)


def test_a_nan_loss_hook_waits_on_an_evaluation_before_training_that_returned_nan(caplog):
    """The usual 'initial loss' print before training: its logits overflow float16, so the
    evaluation run returns NaN.  MonitoredTrainingSession runs the NanTensorHook on it too,
    and the hook ended training before its first step; float32's loss is finite there.  The
    hook waits while the session traces the NaN, and training heals it and goes on."""
    from tfamp_rewrite.training import activation

    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full((8, 16), 100.0, np.float32))
        labels = tf.constant(np.arange(8) % 4)
        hidden = tf1.layers.dense(x, 32, tf.nn.relu, kernel_initializer=tf1.constant_initializer(1.0))
        logits = tf1.layers.dense(hidden, 4, kernel_initializer=tf1.constant_initializer(2.0),
                                  name="logits")  # 102400 in float32, inf in float16
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        global_step = tf1.train.get_or_create_global_step()
        activation.enable_graph_rewrite()
        activation.enable_loss_scaling()   # zero-code: the optimizer is wrapped
        train_op = tf1.train.AdamOptimizer(1e-3).minimize(loss, global_step=global_step)
        hooks = [tf1.train.StopAtStepHook(last_step=5), tf1.train.NanTensorHook(loss)]
    runs = 0
    try:
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            with graph.as_default(), tf1.train.MonitoredTrainingSession(
                    hooks=hooks, save_summaries_steps=None, log_step_count_steps=None) as session:
                initial = session.run(loss)
                while not session.should_stop() and runs < 100:
                    runs += 1
                    session.run(train_op)
    finally:
        activation.deactivate()
    assert np.isnan(initial)
    assert runs < 100   # StopAtStepHook ended it: 5 steps applied
    assert any("'logits/MatMul' (MatMul) is the first float16 node computing inf/nan" in r.getMessage()
               for r in caplog.records)


def test_nothing_found_names_the_programs_own_half_nodes(caplog):
    """A model the program casts to float16 itself overflows in its own half logits, in a
    float32 run as much: the probes watch the rewrite's half nodes only, so nothing is
    found, and the line blamed loops, conds and float32 nodes.  It names the program's."""
    rng = np.random.RandomState(13)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(rng.randint(0, 256, (64, 64)).astype(np.float32))
        labels = tf.constant(rng.randint(0, 10, 64))
        w1 = tf1.get_variable("w1", initializer=rng.standard_normal([64, 256]).astype(np.float32))
        w2 = tf1.get_variable("w2", initializer=4 * rng.standard_normal([256, 10]).astype(np.float32))
        hidden = tf.nn.relu(tf.matmul(tf.cast(x, tf.float16), tf.cast(w1, tf.float16), name="fc1"))
        logits = tf.cast(tf.matmul(hidden, tf.cast(w2, tf.float16), name="fc2"), tf.float32)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(24):
                session.run(train_op)
    (line,) = [r.getMessage() for r in caplog.records if "no half tensor the step computes" in r.getMessage()]
    assert "node(s) the program itself computes in half (e.g. 'fc1'; its own casts)" in line


def test_a_constant_holding_inf_is_named_not_the_half_node_reading_it(caplog):
    """A style target's Gram matrix computed by an earlier (half) run overflowed and was baked
    into the training graph as a constant: the half Sub reading it was healed as the cause,
    then a float32 division was said to make the inf, 'mixed precision did not cause it'.
    The constant is named, as a fed inf is, and nothing is healed."""
    target = np.full([8, 8], 2.0e4, np.float32)
    target[0, 0] = np.inf
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.random.RandomState(0).standard_normal([64, 8]).astype(np.float32))
        w = tf1.get_variable("w", initializer=np.eye(8, dtype=np.float32))
        features = tf.matmul(x, w)
        gram = tf.matmul(features, features, transpose_a=True) / 64.0
        loss = tf.nn.l2_loss(gram - tf.constant(target, name="style_target")) / 64.0
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(6):
                session.run(train_op)
            assert session.heals == []
    (line,) = [r.getMessage() for r in caplog.records if "training steps are being skipped" in r.getMessage()]
    assert "because the run reads a constant holding inf/nan: 'style_target:0' holds inf/nan" in line


def inf_loss_training():
    """exp of a pre-activation of 400 (the default input): inf in float32 too, so every
    loss-scaled step skips, the scale reaches its floor and the session can do nothing
    more.  A fed input of 0.01 gives a finite loss, and that step applies."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder_with_default(np.full((8, 4), 100.0, np.float32), [8, 4], name="x")
        hidden = tf1.layers.dense(x, 1, kernel_initializer=tf1.constant_initializer(1.0))
        loss = tf.reduce_mean(tf.exp(hidden))
        global_step = tf1.train.get_or_create_global_step()
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss, global_step=global_step)
        init = tf1.global_variables_initializer()
    return graph, x, train_op, global_step, init


def test_a_stop_at_step_hook_ends_training_that_skips_every_step_for_good(caplog, monkeypatch):
    """Without a NanTensorHook, global_step never moved and StopAtStepHook waited for ever
    (55,000 runs in 600 s).  Once every step has skipped for good FROZEN_AFTER runs in a
    row, the session says training is frozen and the hook ends it, each said once."""
    from tfamp_rewrite.training import activation

    monkeypatch.setattr(step_watch, "FROZEN_AFTER", 20)
    graph, _, train_op, _, _ = inf_loss_training()
    runs = 0
    try:
        activation.enable_graph_rewrite()
        with graph.as_default():
            hooks = [tf1.train.StopAtStepHook(last_step=5)]
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            with graph.as_default(), tf1.train.MonitoredTrainingSession(
                    hooks=hooks, save_summaries_steps=None, log_step_count_steps=None) as session:
                while not session.should_stop() and runs < 200:
                    runs += 1
                    session.run(train_op)
                stopped = session.should_stop()
    finally:
        activation.deactivate()
    assert stopped
    assert 20 <= runs < 60
    messages = [r.getMessage() for r in caplog.records]
    assert sum("training is frozen: the last 20 runs" in m for m in messages) == 1
    assert sum("StopAtStepHook: training stops at global_step 0, short of its last step 5" in m
               for m in messages) == 1


def test_training_that_applies_a_step_now_and_then_is_not_frozen(caplog, monkeypatch):
    """Runs that skip for good with a step applied between every FROZEN_AFTER - 1 of them
    are training still: nothing is said, and global_step counts the applied steps."""
    monkeypatch.setattr(step_watch, "FROZEN_AFTER", 20)
    graph, x, train_op, global_step, init = inf_loss_training()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for run in range(100):
                feed = {x: np.full((8, 4), 0.01, np.float32)} if run % 19 == 18 else None
                session.run(train_op, feed)
            steps = session.run(global_step)
    assert steps == 100 // 19
    assert not any("training is frozen" in r.getMessage() for r in caplog.records)


# -- an inf/nan whose gradients are finite ------------------------------------------------
def pairwise_distance_net():
    """Batch-hard triplet loss by the pairwise-distance trick on embeddings with |e|^2 ~ 2e5:
    in float16 the Gram matrix e e^T ('gram') overflows, every distance is inf - inf = nan,
    and ``tf.maximum``/``reduce_max`` pass no gradient through nan: the loss is nan, the
    gradients finite (zero), so no step is skipped."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [20, 16], name="x")
        labels = tf1.placeholder(tf.int64, [20], name="labels")
        w = tf1.get_variable("w", initializer=(rng.standard_normal([16, 32]) * 0.2).astype(np.float32))
        embeddings = tf.matmul(x, w)
        gram = tf.matmul(embeddings, embeddings, transpose_b=True, name="gram")
        squares = tf1.diag_part(gram)
        distances = tf.maximum(squares[None, :] - 2.0 * gram + squares[:, None], 0.0)
        same = tf.cast(tf.equal(labels[None, :], labels[:, None]), tf.float32)
        hardest_positive = tf.reduce_max(same * distances, axis=1)
        hardest_negative = tf.reduce_min(distances + tf.reduce_max(distances, 1, keepdims=True) * same, 1)
        loss = tf.reduce_mean(tf.maximum(hardest_positive - hardest_negative + 0.5, 0.0))
        global_step = tf1.train.get_or_create_global_step()
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss, global_step=global_step)
        init = tf1.global_variables_initializer()
    feed = {x: 100.0 + rng.rand(20, 16).astype(np.float32) * 10.0, labels: np.arange(20) % 4}
    return dict(graph=graph, train=train_op, loss=loss, init=init, feed=feed, w=w,
                global_step=global_step)


@pytest.mark.parametrize("through", ["run", "callable"])
def test_a_nan_loss_with_finite_gradients_is_traced_to_its_node_and_healed(caplog, through):
    parts = pairwise_distance_net()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            before = session.run(parts["w"])
            losses = train(parts, session, 24, through)
            moved = np.abs(session.run(parts["w"]) - before).max()
            heals = session.heals
    said = [r.getMessage() for r in caplog.records if "yet its gradients were finite" in r.getMessage()]
    assert len(said) == 1 and "returned inf/nan in %r" % parts["loss"].name in said[0]
    assert "The step's gradients read it" in said[0] and "does not compute" not in said[0]
    (origin,) = [r.getMessage() for r in caplog.records if "found where the inf/nan starts" in r.getMessage()]
    assert "'gram' (MatMul) is the first float16 node computing inf/nan" in origin
    assert [h.nodes[:1] for h in heals] == [["gram"]]
    assert not np.isfinite(losses[0]) and np.isfinite(losses[-1]) and moved > 0


def test_a_masked_value_healed_at_its_reader_is_kept_float32_where_it_travels_on(caplog):
    """SimCLR's NT-Xent (newest pass): the -1e9 diagonal mask subtracted in half is -inf, the
    loss NaN, the gradients finite.  Keeping the Sub float32 is not enough: the concat after
    it still reads -1e9 in half.  The heal keeps the nodes the value reaches too."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [32, 8], name="x")
        w = tf1.get_variable("w", [8, 16])
        h1, h2 = tf.split(tf.math.l2_normalize(tf.matmul(x, w), -1), 2, 0)
        masked = tf.matmul(h1, h1, transpose_b=True) / 0.1 - tf.one_hot(tf.range(16), 16) * 1e9
        logits = tf.concat([tf.matmul(h1, h2, transpose_b=True) / 0.1, masked], 1, name="logits")
        loss = tf1.losses.softmax_cross_entropy(tf.one_hot(tf.range(16), 32), logits)
        train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph, compat="latest") as session:
            session.run(init)
            losses = [session.run([train_op, loss], feed)[1] for _ in range(8)]
            heals = session.heals
    assert not np.isfinite(losses[0]) and np.isfinite(losses[-1]), losses
    assert len(heals) == 1 and {"sub", "logits"} <= set(heals[0].nodes), heals
    (found,) = [r.getMessage() for r in caplog.records if "found where the inf/nan starts" in r.getMessage()]
    assert "does not fit float16 where 'sub' reads it" in found
    assert "^logits$" in re.search(r"TFAMP_REWRITE_NODES_TO_EXCLUDE='([^']*)'", found).group(1).split(",")


@pytest.mark.parametrize("fetch_loss", [True, False], ids=["loss_fetched", "train_op_only"])
def test_an_overflow_inside_a_while_loop_heals_the_loop_not_its_exit(caplog, fetch_loss):
    """Masked attention in a TF1 decoder loop: an all-padding row's -1e9 scores are -inf in
    half, its softmax NaN.  The loop's tensors cannot be probed; the first one seen holding
    inf/nan is its Exit.  One heal keeps the loop's converted nodes float32 -- not the Exit,
    then the Switch, then the Merge that only carry the NaN out, one heal each."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        tf1.set_random_seed(0)
        keys = tf1.placeholder(tf.float32, [8, 6, 16], name="keys")
        lengths = tf1.placeholder(tf.int32, [8], name="lengths")
        target = tf1.placeholder(tf.float32, [8, 16], name="target")
        query_kernel = tf1.get_variable("query_kernel", [16, 16])
        padding = 1.0 - tf.sequence_mask(lengths, 6, dtype=tf.float32)

        def attend(step, state):
            query = tf.matmul(state, query_kernel)
            scores = tf.squeeze(tf.matmul(keys, query[:, :, None]), -1) + padding * -1e9
            return step + 1, tf.squeeze(tf.matmul(tf.nn.softmax(scores)[:, None, :], keys), 1)

        _, context = tf.while_loop(lambda step, state: step < 3, attend, [0, tf.ones([8, 16])])
        loss = tf.reduce_mean(tf.square(context - target))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    rng = np.random.default_rng(0)
    feed = {keys: rng.standard_normal((8, 6, 16)), lengths: np.array([0] + [6] * 7),  # an empty row
            target: rng.standard_normal((8, 16))}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(30):
                session.run([train_op, loss] if fetch_loss else train_op, feed)
            before = session.run(query_kernel)
            final_loss = session.run([train_op, loss], feed)[1]
            moved = np.abs(session.run(query_kernel) - before).max()
            heals = session.heals
    assert len(heals) == 1 and {"while/Softmax", "while/add", "while/MatMul"} <= set(heals[0].nodes)
    assert np.isfinite(final_loss) and moved > 0  # the step applied
    (said,) = [r.getMessage() for r in caplog.records if "while loop 'while/while_context'" in r.getMessage()]
    assert "'while/Exit_1'" in said and "cannot be" in said


def test_a_weight_gradient_summed_out_of_a_backward_loop_heals_that_loop(caplog):
    """An LSTM's Gaussian likelihood of raw loads (about 3000): inside the backward while
    loop each time step's kernel-gradient MatMul overflows half at any loss scale, summed in
    float32 and carried out by an Exit nothing probes, into the float32 unscale op.  The
    heal keeps the backward loop's converted nodes float32 -- not the nearest half node
    upstream of the unscale op, a finite gradient of another layer, which healed nothing
    and left every later step skipped."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [16, 12, 1], name="x")
        y = tf1.placeholder(tf.float32, [16, 12, 1], name="y")
        h, _ = tf1.nn.dynamic_rnn(tf1.nn.rnn_cell.LSTMCell(8), x, dtype=tf.float32)
        mu = tf1.layers.dense(h, 1, name="mu")
        sigma = tf.nn.softplus(tf1.layers.dense(h, 1, name="sigma")) + 1e-6
        loss = tf.reduce_mean(tf.math.log(sigma) + 0.5 * tf.square((y - mu) / sigma))
        train_op = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(3e-3), "dynamic").minimize(loss)
        init = tf1.global_variables_initializer()
    rng = np.random.default_rng(0)
    loads = rng.random((16, 12, 1)).astype(np.float32) * 3000
    feed = {x: loads, y: 3000 + 0.1 * loads}
    # one thread: sums in one order, so each run finds the culprits in the same order
    config = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph, config=config) as session:
            session.run(init)
            losses = [session.run([train_op, loss], feed)[1] for _ in range(60)]
            heals = session.heals
    loop_heals = [h for h in heals if any(n.startswith("gradients/rnn/while/") for n in h.nodes)]
    assert loop_heals and "gradients/rnn/while/lstm_cell/MatMul_grad/MatMul_1" in loop_heals[0].nodes
    # steps apply again (a skipped step leaves the loss as it was; a few still skip while
    # the scale finds its level)
    assert losses[-1] < losses[0] and len(set(losses[-10:])) >= 5
    said = [r.getMessage() for r in caplog.records if "while loop 'gradients/rnn/while/while_context'" in
            r.getMessage()]
    assert said and re.search(r"into float32 '[^']*unscale_and_check_finite", said[0])
    assert "weight gradient" in said[0]
    assert said[0].count("while loop 'gradients/rnn/while/while_context'") == 1  # one culprit, said once


def test_a_loss_scale_initialized_again_between_steps_is_said_once(caplog):
    """Reptile resets its optimizer per task with tf.variables_initializer(opt.variables()),
    which holds the loss scale's variables too: each task starts again at 32768 and skips
    its first steps.  Said once; the scale's own moves and a heal's restart are not."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [10, 1], name="x")
        w = tf1.get_variable("w", initializer=np.full([1, 32], 0.5, np.float32))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 3000.0))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(0.02), "dynamic")
        train_op = opt.minimize(loss)
        reset = tf1.variables_initializer(opt.variables())
        init = tf1.global_variables_initializer()
    feed = {x: np.linspace(-5, 5, 10, dtype=np.float32)[:, None]}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(6):  # the scale falls while the gradients overflow: no line
                session.run(train_op, feed)
            assert not [r for r in caplog.records if "which no step does" in r.getMessage()]
            for _ in range(3):  # three tasks
                session.run(reset)
                for _ in range(2):
                    session.run(train_op, feed)
    (said,) = [r.getMessage() for r in caplog.records if "which no step does" in r.getMessage()]
    assert "to 32768 in its next step" in said and "'loss_scale' not in v.name" in said


def test_an_origin_found_on_a_skipped_step_is_healed_as_a_skipped_steps_culprit(caplog):
    """An evaluation run returns NaN first (a -9e15 mask: inf in float16, and a padded row's
    softmax of all -inf); the search finds the node on the next training run, whose step
    skipped: the heal says so, and restarts the loss scale as a skipped step's heal does."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default():
        scores = tf1.placeholder(tf.float32, [4, 8, 8], name="scores")
        adjacency = tf1.placeholder(tf.float32, [4, 8, 8], name="adjacency")
        w = tf1.get_variable("w", initializer=np.ones([8, 8], np.float32))
        logits = tf.reshape(tf.matmul(tf.reshape(scores, [-1, 8]), w), [4, 8, 8])
        attention = tf.nn.softmax(tf1.where(adjacency > 0, logits, -9e15 * tf.ones_like(logits)))
        loss = tf.reduce_mean(tf.square(tf.matmul(attention, logits)))  # NaN gradients too
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    padded = np.zeros([4, 8, 8], np.float32)
    padded[:, :5, :5] = 1.0  # rows 5..7 have no neighbour
    feed = {scores: rng.standard_normal([4, 8, 8]).astype(np.float32), adjacency: padded}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            assert not np.isfinite(session.run(loss, feed))
            losses = [session.run([train_op, loss], feed)[1] for _ in range(3)]
            heals = session.heals
    (heal,) = heals
    assert "Select" in heal.nodes and heal.trajectory.endswith("on a skipped step")
    (healed,) = [r.getMessage() for r in caplog.records if "tfamp_rewrite: healed:" in r.getMessage()]
    assert "the loss scale restarts from its initial value (steps whose gradients are too large" in healed
    assert np.isfinite(losses[-1])


@pytest.mark.parametrize("auto_fix", ["1", "0"])
def test_a_nan_loss_hook_waits_while_a_nan_with_finite_gradients_is_traced(monkeypatch, caplog, auto_fix):
    """An Estimator's NanTensorHook: the session traces and heals the inf/nan, so the hook
    lets its NaN losses pass meanwhile; with healing off it stops training at once, after
    the session said what happened."""
    from tfamp_rewrite.training import activation

    monkeypatch.setenv(step_watch.AUTO_FIX_ENV, auto_fix)
    parts = pairwise_distance_net()
    with parts["graph"].as_default():
        hooks = [tf1.train.NanTensorHook(parts["loss"])]
    activation.enable_graph_rewrite()
    losses, stopped = [], None
    try:
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            with parts["graph"].as_default(), tf1.train.MonitoredTrainingSession(hooks=hooks) as session:
                for _ in range(12):
                    losses.append(session.run([parts["train"], parts["loss"]], parts["feed"])[1])
    except tf1.train.NanLossDuringTrainingError as error:
        stopped = error
    finally:
        activation.deactivate()
    assert "yet its gradients were finite" in caplog.text
    if auto_fix == "1":
        assert stopped is None and np.isfinite(losses[-1])
    else:
        assert stopped is not None and losses == []


def ssim_loss_net():
    """An image optimised towards a target by ``1 - ssim(max_val=255)``: the Gaussian
    smoothing of x^2 + y^2 (about 1.3e5) overflows a float16 depthwise convolution, SSIM's
    ratio is finite / inf = 0, the loss 1, its gradients zero -- every value finite."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    target = rng.uniform(100, 255, (2, 24, 24, 1)).astype(np.float32)
    start = np.clip(target + rng.standard_normal(target.shape).astype(np.float32) * 40, 0, 255)
    with graph.as_default():
        image = tf1.get_variable("image", initializer=start)
        loss = 1.0 - tf.reduce_mean(tf.image.ssim(image, tf.constant(target), max_val=255.0))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(2.0), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    return dict(graph=graph, train=train_op, loss=loss, init=init, image=image)


@pytest.mark.parametrize("through", ["run", "callable"])
def test_a_loss_whose_denominator_overflowed_is_said_traced_and_healed(caplog, through):
    """Nothing returned is inf/nan and no step skips, yet the image never moves: the
    training run's forward pass hides an inf, which is said, traced and healed -- the same
    through a callable made from options (Keras in TF1 graph mode)."""
    parts = ssim_loss_net()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            losses = train(parts, session, 12, through)
            heals = session.heals
    assert losses[0] == losses[1] == 1.0  # float32: 0.28, then falling
    (said,) = [r.getMessage() for r in caplog.records if "which the values it returned do not show" in
               r.getMessage()]
    assert re.search(r"computed inf/nan in '[^']+', read by 'SSIM/[^']+' \(RealDiv\)", said)
    assert "its gradients were finite, so its step applied" in said
    assert heals and "SSIM/depthwise_3" in heals[0].nodes
    assert heals[0].env and "ALLOWLIST_REMOVE=DepthwiseConv2dNative" in heals[0].env
    assert np.isfinite(losses[-1]) and losses[-1] < 0.5  # it trains once healed


def test_a_hidden_inf_of_training_runs_is_healed_while_an_evaluations_search_waits(caplog):
    """A baseline SSIM evaluated once before training (its own nodes, 'SSIM_1') starts a
    search no training run computes; the training runs' hidden inf in 'SSIM' is still
    checked, said, traced and healed -- it was left unwatched, the loss 1 for good."""
    parts = ssim_loss_net()
    with parts["graph"].as_default():
        baseline = tf.reduce_mean(tf.image.ssim(parts["image"], parts["image"] * 0.5, max_val=255.0))
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            session.run(baseline)
            losses = train(parts, session, 12)
            heals = session.heals
    assert any("computed inf/nan in" in r.getMessage() and "SSIM_1/" in r.getMessage()
               for r in caplog.records)                                # the evaluation's, first
    assert heals and "SSIM/depthwise_3" in heals[0].nodes
    assert np.isfinite(losses[-1]) and losses[-1] < 0.5  # it trains once healed


def test_state_the_steps_read_holding_nan_is_named_and_nothing_is_healed(caplog):
    """A memory bank (non-trainable, read by the logits) left NaN by a write the session
    does not guard -- here a fed value -- skips every step in float32 too: the warning names
    the bank, and no half node is healed for it (a presumed culprit was, before)."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 16], name="x")
        w = tf1.get_variable("w", initializer=(rng.standard_normal([16, 4]) * 0.1).astype(np.float32))
        bank = tf1.get_variable("bank", initializer=tf.ones([6, 4]), trainable=False)
        logits = tf.matmul(tf.matmul(x, w), bank, transpose_b=True)
        loss = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.zeros([8], tf.int64), logits=logits))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic")
        train_op = opt.minimize(loss)
        refill = tf1.placeholder(tf.float32, [6, 4], name="refill")
        poison = tf1.assign(bank, refill)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            session.run(poison, {refill: np.full([6, 4], np.nan, np.float32)})
            for _ in range(20):
                session.run(train_op, {x: rng.standard_normal([8, 16]).astype(np.float32)})
            assert session.heals == []
    (said,) = [r.getMessage() for r in caplog.records if "holds inf/nan" in r.getMessage()]
    assert "because state the steps read is not finite: variable 'bank' holds inf/nan" in said
    assert "A write of an earlier run put it there" in said


def test_a_gradient_no_optimizer_applies_is_no_culprit(caplog):
    """Feature maximisation through a frozen conv: tf.gradients builds the frozen kernel's
    gradient beside the image's (~1e7 unscaled, beyond float16 at any scale), but no step's
    finite check reads it.  It was blamed and healed, and the scale restarted for nothing."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        image = tf1.get_variable("image", initializer=rng.uniform(0, 255, (1, 16, 16, 3)).astype(np.float32))
        kernel = tf1.get_variable("frozen_kernel", trainable=False,
                                  initializer=rng.normal(0, 0.3, (3, 3, 3, 8)).astype(np.float32))
        features = tf.nn.relu(tf.nn.conv2d(image - 120.0, kernel, [1, 1, 1, 1], "SAME"))
        loss = -800.0 * tf.reduce_sum(features[..., 0])
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1.0), "dynamic")
        train = opt.minimize(loss, var_list=[image])
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(24):
            session.run(train)
        assert not session.heals
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "Conv2DBackpropFilter" not in said
    assert "until the loss scale fell far enough" in said  # the image's gradient needed a lower scale
    assert "so nothing is kept float32 for them" in said  # no heal came before


def test_the_first_skipped_step_is_said_once_per_process_not_per_session(caplog):
    """A hyperparameter sweep or a k-fold loop trains a fresh session (and graph) per trial,
    and each skips its first steps alike: the "(said once)" line was said per session."""
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        for _ in range(3):
            parts = scale_net()
            with tfamp_rewrite.Session(graph=parts["graph"]) as session:
                session.run(parts["init"])
                train(parts, session, 24)
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "a training step was skipped" in m]) == 1
    assert len([m for m in said if "until the loss scale fell far enough" in m]) == 1


def test_heals_of_a_session_that_diverges_anyway_are_not_carried_to_the_next_trial(caplog):
    """A learning-rate sweep builds a graph per trial.  Its first trial diverges in float32
    too; the session healed layer after layer as the weights grew, and every later trial,
    with the same layer names and a sane rate, started with them float32 (0 nodes converted)."""
    rng = np.random.RandomState(0)
    inputs = rng.randn(512, 16).astype(np.float32)
    targets = np.sin(inputs[:, :4].sum(1, keepdims=True)).astype(np.float32)

    def trial(learning_rate):
        graph = tf.Graph()
        with graph.as_default():
            tf1.set_random_seed(1)
            x = tf1.placeholder(tf.float32, [None, 16])
            y = tf1.placeholder(tf.float32, [None, 1])
            h = tf1.layers.dense(x, 64, activation=tf.nn.relu, name="fc1")
            h = tf1.layers.dense(h, 64, activation=tf.nn.relu, name="fc2")
            loss = tf.reduce_mean(tf.square(tf1.layers.dense(h, 1, name="out") - y))
            opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.MomentumOptimizer(learning_rate, 0.9), "dynamic")
            train_op = opt.minimize(loss)
            init = tf1.global_variables_initializer()
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(120):
                batch = rng.randint(0, 512, 64)
                session.run(train_op, {x: inputs[batch], y: targets[batch]})
            return session.heals, session.rewrite_reports[0].nodes_converted

    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        diverged_heals, _ = trial(3.0)
        assert diverged_heals  # the weights grew past float16, layer after layer
        heals, converted = trial(0.03)
    assert not heals and converted > 0
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "the model most likely fails in float32 as well" in said
    assert "start without these heals" in said


def test_an_overflow_a_clip_at_zero_hides_is_found_and_healed_without_shape_readers(caplog):
    """Pairwise squared distances as |a|^2 + |b|^2 - 2ab, clipped by tf.maximum(., 0) (the
    metric-learning idiom), on 0..255-scale embeddings: the half Gram matrix overflows, the
    clipped distances are exactly 0, the loss finite and its gradients zero -- nothing was
    said while the weights stayed put.  The heal named a Shape reader of the Gram's value."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 32])
        y = tf1.placeholder(tf.float32, [None])
        embeddings = tf1.layers.dense(tf1.layers.dense(x, 64, activation=tf.nn.relu), 16)
        squares = tf.reduce_sum(tf.square(embeddings), 1, keepdims=True)
        gram = tf.matmul(embeddings, embeddings, transpose_b=True, name="gram")
        distances = tf.maximum(squares + tf.transpose(squares) - 2.0 * gram, 0.0)
        same = tf.cast(tf.equal(y[:, None], y[None, :]), tf.float32)
        apart = tf.square(tf.maximum(100.0 - tf.sqrt(distances + 1e-6), 0.0))
        loss = tf.reduce_mean(same * distances + (1 - same) * apart)
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic")
        train_op = opt.minimize(loss)
        init = tf1.global_variables_initializer()
    labels = rng.randint(0, 4, 64).astype(np.float32)
    feed = {x: (rng.uniform(0, 255, (64, 32)) * 0.5 + labels[:, None] * 40).astype(np.float32), y: labels}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        losses = [session.run([train_op, loss], feed)[1] for _ in range(30)]
        heals = session.heals
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "read by 'Maximum' (Maximum), which the values it returned do not show" in said
    assert [h.nodes for h in heals] == [["gram"]]
    assert losses[-1] < 0.7 * losses[0]


def test_a_training_graph_resumed_with_import_meta_graph_keeps_its_step_watch(caplog):
    """A resumed run imports the training graph with its MetaGraph: the steps' signals were a
    Python attribute of the graph that built it, so the import's skipped steps went unsaid
    and undiagnosed.  They are rebuilt from the MetaGraph, and the heal is a skipped step's."""
    built = tf.Graph()
    with built.as_default():
        x = tf1.placeholder(tf.float32, [16, 8], name="x")
        y = tf1.placeholder(tf.int64, [16], name="y")
        hidden = tf1.layers.dense(x, 16, tf.nn.relu, name="dense")
        loss = tf1.losses.sparse_softmax_cross_entropy(y, tf1.layers.dense(hidden, 4, name="out"))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic")
        tf1.add_to_collection("train_op", opt.minimize(loss))
        exported = tf1.train.export_meta_graph()
    resumed = tf.Graph()
    with resumed.as_default():
        tf1.train.import_meta_graph(exported)
        train_op = resumed.get_collection("train_op")[0]
        init = tf1.global_variables_initializer()
    (signal,) = step_signals(resumed)
    assert signal.all_finite.graph is resumed and signal.loss_scale.initial_loss_scale == 2 ** 15
    assert [v.op.name for v in signal.loss_scale.variables()] == ["loss_scale/current_loss_scale",
                                                                  "loss_scale/good_steps"]
    rng = np.random.RandomState(0)
    feed = {"x:0": rng.standard_normal([16, 8]).astype(np.float32) * 3e4, "y:0": rng.randint(0, 4, 16)}
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=resumed) as session:
            session.run(init)
            for _ in range(8):
                session.run(train_op, feed)
            heals = session.heals
    assert any("a training step was skipped" in r.getMessage() for r in caplog.records)
    assert heals and "inference" not in heals[0].trajectory


def test_an_ensembles_members_that_skip_alike_are_each_said(caplog):
    """Members of an ensemble, each with its own optimizer and loss scale, skip alike: the
    lines named only the first, as if one member alone had a scale too high."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full([8, 8], 8.0, np.float32))
        trains = []
        for scope in ("member0", "member1"):
            with tf1.variable_scope(scope):
                w = tf1.get_variable("w", initializer=np.full([8, 1], 0.5, np.float32))
            loss = tf.reduce_sum(tf.square(tf.matmul(x, w))) / 2.0
            opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
            trains.append(opt.minimize(loss, var_list=[w]))
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(30):
                session.run(trains)
    (said,) = [r.getMessage() for r in caplog.records if "a training step was skipped" in r.getMessage()]
    assert ("(the step updating 'member0/w'; in the same run 1 other optimizer's step too, each "
            "with its own loss scale)") in said
    settled = [r.getMessage() for r in caplog.records if "fell far enough" in r.getMessage()]
    assert len(settled) == 2
    assert "(those updating 'member0/w')" in settled[0] and "(those updating 'member1/w')" in settled[1]
    assert "their own loss scale fell far enough too" in settled[1]


@pytest.mark.parametrize("overflows", [True, False])
def test_training_frozen_inside_a_tf1_while_loop_is_said_once(caplog, overflows):
    """TPU-style iterations_per_loop: a forward overflow skips every step in the loop, the
    scale sits at its minimum and global_step stays 0 -- unsaid but for the line that the
    loop's steps are not watched."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf.constant(np.full([4, 8], 3e3 if overflows else 1.0, np.float32))
        w = tf1.get_variable("w", initializer=tf1.ones([8, 4]) * 8.0)
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-9))

        def trained_loss():  # logits 9.6e4: inf in float16, and so are the gradients
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w, name="logits")))
            with tf.control_dependencies([optimizer.minimize(loss)]):
                return tf.identity(loss)

        fetch = tf1.while_loop(lambda i, _: i < 20, lambda i, _: (i + 1, trained_loss()), [0, 0.0])[1]
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(8):
                session.run(fetch)
    said = [r.getMessage() for r in caplog.records if "looks frozen" in r.getMessage()]
    if not overflows:
        assert said == []
        return
    (line,) = said
    assert "tf.while_loop 'while' looks frozen" in line and "at its minimum (1)" in line
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^while/'" in line


@pytest.mark.parametrize("auto_fix,heals,said", [
    (True, 0, "Float32 would have applied these steps' inf/nan updates"),
    (True, 2, "reached its limit of 2 heals, so the inf/nan may still be float16's"),
    (False, 0, "Healing is off (TFAMP_REWRITE_AUTO_FIX=0)"),
])
def test_the_frozen_line_says_float32_would_fail_alike_only_when_the_session_could_act(
        caplog, auto_fix, heals, said):
    """An unrolled Sinkhorn loss healed one iteration per heal up to the limit, froze, and
    was told float32 would have applied inf/nan updates -- float32 trains it."""
    from types import SimpleNamespace

    from tfamp_rewrite.training.step_watch import StepWatch

    watch = StepWatch(SimpleNamespace(dtype="float16"), auto_fix=auto_fix, max_heals=2)
    watch.heals = [object()] * heals
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        watch._say_frozen()
    (line,) = [r.getMessage() for r in caplog.records if "training is frozen" in r.getMessage()]
    assert said in line


def test_a_partial_run_computing_a_loss_scaled_step_says_it_is_not_watched(caplog):
    """REINFORCE by partial_run: the forward pass, a sample, then the update in the same
    step. A partial run cannot fetch the step's flag, and every step skipped unsaid."""
    parts = overflow_net()
    feed = parts["feed"]
    with parts["graph"].as_default(), tf.control_dependencies([parts["train"]]):
        stepped = tf.identity(parts["loss"])  # partial runs fetch tensors only
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            for _ in range(2):
                handle = session.partial_run_setup([parts["loss"], stepped], list(feed))
                session.partial_run(handle, [parts["loss"], stepped], feed)
    said = [r.getMessage() for r in caplog.records
            if "a partial run computes a loss-scaled step" in r.getMessage()]
    assert len(said) == 1 and "not said, diagnosed or healed" in said[0]


def test_nothing_found_names_a_decomposition_of_a_matrix_half_nodes_computed():
    """A GP's Cholesky of a kernel matrix whose half MatMul rounded it indefinite fills NaN
    from finite values no probe sees: the line said the culprit may sit in a while loop."""
    from types import SimpleNamespace

    from tfamp_rewrite.training.step_watch import StepWatch

    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 2], name="x")
        kernel = tf.exp(-tf.matmul(x, x, transpose_b=True, name="gram")) + 1e-6 * tf.eye(8)
        tf.linalg.cholesky(kernel, name="chol")
    shadow = SimpleNamespace(dtype="float16", user_graph=graph, converted_now=lambda: {"gram"})
    clause = StepWatch(shadow, auto_fix=True)._decompositions_of_half()
    assert "be 'chol' (Cholesky), which decomposes a matrix float16 nodes computed" in clause
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^gram$'" in clause
    shadow.converted_now = lambda: set()
    assert StepWatch(shadow, auto_fix=True)._decompositions_of_half() == ""


def test_one_optimizer_applying_twice_in_a_run_is_not_said_to_be_two(caplog):
    """tf_cnn_benchmarks' 'replicated' update: one optimizer, one apply_gradients per
    variable copy. The first-skip line counted the second call as another optimizer with
    its own loss scale."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full([8, 8], 8.0, np.float32))
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-6), "dynamic")
        trains = []
        for scope in ("copy0", "copy1"):
            with tf1.variable_scope(scope):
                w = tf1.get_variable("w", initializer=np.full([8, 1], 0.5, np.float32))
            trains.append(opt.minimize(tf.reduce_sum(tf.square(tf.matmul(x, w))) / 2.0, var_list=[w]))
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(trains)
    (said,) = [r.getMessage() for r in caplog.records if "a training step was skipped" in r.getMessage()]
    assert "other optimizer" not in said


def test_a_run_pushing_loss_scaled_gradients_to_an_accumulator_is_not_an_inference(caplog):
    """A SyncReplicasOptimizer worker pushes its loss-scaled gradients into the chief's
    ConditionalAccumulators: an overflow there was called an inference's inf/nan that
    'nothing skipped or healed', though the chief's loss-scaled step skips it."""
    parts = overflow_net()
    graph = parts["graph"]
    with graph.as_default():
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic")
        (gradient, weight), = [(g, v) for g, v in opt.compute_gradients(parts["loss"]) if "w2" in v.name]
        accumulator = tf1.ConditionalAccumulator(tf.float32, shape=weight.shape, shared_name="w2_grads")
        push = accumulator.apply_grad(gradient, local_step=0)
        opt.apply_gradients([(accumulator.take_grad(1), weight)])  # the chief's step
        init = tf1.variables_initializer(opt.variables())
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run([parts["init"], init])
            for _ in range(3):
                loss = session.run([push, parts["loss"]], parts["feed"])[1]  # a worker logs its loss
    assert not np.isfinite(loss)  # the forward pass overflowed half
    assert "computed no loss-scaled step" not in caplog.text


def test_heals_of_a_trial_that_diverges_in_float32_too_are_not_handed_to_the_next(caplog):
    """A learning-rate sweep in one process: the lr=5 trial diverges in float32 as well,
    heals node after node while its weights blow up, and closes before any verdict.  Its
    heals were remembered, so every later trial ran with nothing in float16, unsaid."""
    rng = np.random.RandomState(0)
    features = (rng.normal(0, 1, (512, 20)) * 40).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)

    def trial(learning_rate):
        graph = tf.Graph()
        with graph.as_default():
            tf1.set_random_seed(0)
            x = tf1.placeholder(tf.float32, [None, 20], name="x")
            y = tf1.placeholder(tf.int64, [None], name="y")
            w1 = tf1.get_variable("w1", initializer=tf1.random_normal([20, 32], stddev=0.01))
            w2 = tf1.get_variable("w2", initializer=tf1.random_normal([32, 2], stddev=0.01))
            logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
            loss = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            optimizer = tfamp_rewrite.LossScaleOptimizer(
                tf1.train.GradientDescentOptimizer(learning_rate), "dynamic")
            train_op = optimizer.minimize(loss)
            init = tf1.global_variables_initializer()
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            for _ in range(60):
                session.run(train_op, {x: features, y: labels})
            return session.heals, session.rewrite_reports[0].nodes_converted

    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        diverged_heals, _ = trial(5.0)
        sane_heals, converted = trial(1e-3)
    assert diverged_heals and not sane_heals
    (said,) = [r.getMessage() for r in caplog.records
               if "closed with its loss inf/nan again" in r.getMessage()]
    assert "later sessions of this process start without them" in said
    assert converted > 0  # the next trial starts with its float16 nodes


def test_trials_saving_into_one_directory_each_restore_their_own_heals(tmp_path, monkeypatch, caplog):
    """A sweep's trials, each a process, save into one directory: the heal file beside the
    checkpoints was one per directory, so restoring a trial that healed nothing kept the
    other trial's heals float32 (and said its training run had kept them)."""
    directory = str(tmp_path)
    prefixes = {}
    for name, input_scale in (("overflowing", 2000.0), ("fitting", 1.0)):
        monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # trials in processes of their own
        parts = overflow_net(input_scale=input_scale)
        with parts["graph"].as_default():
            saver = tf1.train.Saver()
        with tfamp_rewrite.Session(graph=parts["graph"]) as session:
            session.run(parts["init"])
            train(parts, session, 12)
            prefixes[name] = saver.save(session, directory + "/" + name)
            assert bool(session.heals) == (name == "overflowing")

    def restored(name):
        monkeypatch.setattr(heal_memory, "_healed_in_process", {})  # another process
        monkeypatch.setattr(devices, "_logged", set())
        caplog.clear()
        again = overflow_net()
        with again["graph"].as_default():
            restorer = tf1.train.Saver()
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            with tfamp_rewrite.Session(graph=again["graph"]) as evaluation:
                restorer.restore(evaluation, prefixes[name])
                evaluation.run("logits:0", {again["batch"]: next(iter(again["feed"].values()))})
                kept = evaluation.rewrite_reports[-1].decision("logits").dtype == "float32"
        return kept, [r.getMessage() for r in caplog.records if "restored a checkpoint" in r.getMessage()]

    assert restored("fitting") == (False, [])
    kept, said = restored("overflowing")
    assert kept and len(said) == 1


def test_a_heal_of_an_input_past_half_stays_when_the_trial_diverges(caplog):
    """A Cox model on a raw income (6.9e5) in a learning-rate sweep: the heal of the MatMul
    reading it is the data's, and the first trial's later NaN (its lr diverges in float32
    too) took it back, so the next trial overflowed and healed again."""
    rng = np.random.RandomState(3)
    count = 500
    features = np.stack([rng.uniform(25, 90, count), rng.lognormal(10.9, 0.7, count)], 1).astype(np.float32)
    events = np.ones(count, np.float32)

    def trial(learning_rate):
        graph = tf.Graph()
        with graph.as_default():
            beta = tf1.get_variable("beta", [2, 1], initializer=tf1.zeros_initializer())
            x = tf1.placeholder(tf.float32, [count, 2], name="x")
            risk = tf.squeeze(tf.matmul(x, beta), 1)
            top = tf.reduce_max(risk)
            log_risk_set = tf.reverse(tf.math.log(tf.cumsum(tf.exp(tf.reverse(risk, [0]) - top))), [0]) + top
            loss = -tf.reduce_mean((risk - log_risk_set) * events)
            optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(learning_rate), "dynamic")
            train_op = optimizer.minimize(loss)
            init = tf1.global_variables_initializer()
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            losses = [session.run([train_op, loss], {x: features})[1] for _ in range(40)]
            return session, losses

    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        diverged, diverged_losses = trial(0.01)
        sane, losses = trial(1e-4)
    assert diverged.heals and not np.isfinite(diverged_losses[-1])
    assert sane.rewrite_reports[0].decision("MatMul").dtype == "float32" and not sane.heals
    assert np.isfinite(losses).all()
    assert not [r for r in caplog.records if "closed with its loss inf/nan again" in r.getMessage()]


def test_a_restored_heal_of_a_name_another_op_took_is_left_and_said(tmp_path, caplog, monkeypatch):
    """The training graph healed its chamfer BatchMatMul 'MatMul'; the evaluation graph built
    a rotation tf.matmul first, which took the name, and the restore kept that MatMul float32
    instead -- the wrong node, with the right one still in half."""
    from tfamp_rewrite.training import checkpoint_heals

    monkeypatch.setattr(devices, "_logged", set())
    prefix = str(tmp_path / "model")
    checkpoint_heals.save_beside(prefix, {"MatMul"}, [], {"MatMul": "BatchMatMulV2"})
    evaluation = tf.Graph()
    with evaluation.as_default():
        points = tf.ones([2, 4, 3])
        rotated = tf.reshape(tf.matmul(tf.reshape(points, [-1, 3]), tf.eye(3)), [2, 4, 3])
        tf.matmul(rotated, rotated, transpose_b=True)  # 'MatMul_1' here
    training = tf.Graph()
    with training.as_default():
        tf.matmul(tf.ones([2, 4, 3]), tf.ones([2, 4, 3]), transpose_b=True)  # 'MatMul', as healed
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        assert checkpoint_heals.kept_beside(prefix, evaluation) == []
        assert checkpoint_heals.kept_beside(prefix, training) == ["MatMul"]
    (said,) = [r.getMessage() for r in caplog.records if "left as it is" in r.getMessage()]
    assert "'MatMul' float32, a BatchMatMulV2 where it was healed; in this graph 'MatMul' is a MatMul" in said


def test_an_evaluation_in_the_same_process_says_its_carried_heals_once(tmp_path, caplog, monkeypatch):
    """An Estimator's evaluation, in the process that healed: the heals carried in the
    process and the heal file beside the checkpoint keep the same nodes, and both said so."""
    heals, prefix = healed_checkpoint(str(tmp_path / "model"))
    assert heals
    monkeypatch.setattr(devices, "_logged", set())
    again = overflow_net()
    with again["graph"].as_default():
        restorer = tf1.train.Saver()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=again["graph"]) as evaluation:
            restorer.restore(evaluation, prefix)
    said = [r.getMessage() for r in caplog.records
            if "sessions made after a heal" in r.getMessage() or "restored a checkpoint" in r.getMessage()]
    assert len(said) == 1 and "sessions made after a heal" in said[0]


def test_a_float32_input_whose_large_column_no_half_node_reads_is_no_culprit(caplog):
    """Raw covariates [age, income, blood pressure]: the income column (2.5e5) goes to a
    float32 log, the others are sliced into a dense layer.  The slices read the input in
    half, so the whole input was judged: 'does not fit float16 whatever the loss scale',
    five nodes healed for nothing, and the scale restarted to fall again."""
    rng = np.random.RandomState(0)
    count = 256
    inputs = np.stack([rng.uniform(20, 90, count), rng.lognormal(10.8, 0.6, count),
                       rng.normal(130, 15, count)], 1).astype(np.float32)
    inputs[0, 1] = 2.5e5
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        features = tf.concat([x[:, :1], tf.math.log(x[:, 1:2]), x[:, 2:]], 1)
        glorot = tf1.glorot_uniform_initializer
        hidden = tf1.layers.dense(features, 16, tf.nn.relu, kernel_initializer=glorot(seed=1))
        risk = tf1.layers.dense(hidden, 1, kernel_initializer=glorot(seed=2))
        loss = tf.reduce_mean(tf.square(risk))  # its gradients are too large for the top scales
        train_op = tfamp_rewrite.LossScaleOptimizer(tf1.train.AdamOptimizer(1e-3), "dynamic").minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(30):
            session.run(train_op, {x: inputs})
        assert not session.heals
    assert not culprit_messages(caplog)


def test_weights_an_init_wrote_before_its_heal_are_said_as_such_and_the_heal_stays(caplog):
    """Phase retrieval's spectral init: v assigned from a half Gram-matrix MatMul that
    overflowed, healed; training then skipped on v's NaN, and the line said mixed precision
    did not cause it and took the heal back for later sessions."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(rng.randn(1024, 64).astype(np.float32))
        y = tf.constant((rng.randn(1024, 1) * 10).astype(np.float32) ** 2)
        gram = tf.matmul(a * y, a, transpose_a=True, name="gram") / 1024.0  # 1e5 before the division
        v = tf1.get_variable("v", initializer=tf.ones([64, 1]) / 8.0)
        power = tf1.assign(v, tf.math.l2_normalize(tf.matmul(gram, v), 0))
        loss = tf.reduce_mean(tf.square(tf.matmul(a, v) - 1.0))
        optimizer = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), "dynamic")
        train_op = optimizer.minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        for _ in range(5):
            session.run(power)
        assert [h.nodes[:1] for h in session.heals] == [["gram"]]
        for _ in range(20):
            session.run(train_op)
    (said,) = [r.getMessage() for r in caplog.records if "own weights are not finite" in r.getMessage()]
    assert "Runs before a heal of this session wrote float16's inf/nan into 'v'" in said
    assert "did not cause it" not in said and "start without them" not in said
    assert "gram" in heal_memory.healed_in_this_process(graph)  # later sessions start healed

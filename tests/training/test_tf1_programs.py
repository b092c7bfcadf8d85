"""What TF1 programs are made of, under the rewrite: each test fails if the rewrite did not run.

Reference variables (``VariableV2``, ``float_ref`` edges), ``Switch``/``Merge`` conds,
``Enter``/``Exit`` loops, queue runners with several threads calling ``run`` at once,
``Supervisor`` and ``MonitoredTrainingSession`` with hooks, and ``Saver`` checkpoints moving
between float32 and mixed-precision runs.  Each graph holds a MatMul of 2**10-sized values
whose result overflows float16 only, so an inf proves the rewrite ran where it should.
They run in the ``--tf1-behavior`` pass (``make test``'s second pass), where TensorFlow
builds these graphs as TensorFlow 1.15 does; the premises say so.
"""
import threading

import numpy as np
import pytest
import tensorflow as tf

import tfamp_rewrite
from tfamp_rewrite.training import activation
from tfamp_rewrite.training.session import TF_SESSION_CLASSES

pytestmark = pytest.mark.tf1_behavior("builds TF1 graphs: ref variables, control flow v1, queues")

tf1 = tf.compat.v1
BIG = 2.0 ** 10


def float32_session(graph):
    """TensorFlow's own session, made while the rewrite is switched off for a moment."""
    activation.disable_graph_rewrite()
    try:
        session = TF_SESSION_CLASSES["Session"](graph=graph)
    finally:
        activation.enable_graph_rewrite()
    assert not isinstance(session, tfamp_rewrite.Session)
    return session


@pytest.fixture(autouse=True)
def amp_on_the_cpu(monkeypatch):
    """Zero-code AMP as a TF1 user gets it: every new session rewrites (emulated numerics)."""
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    activation.enable_graph_rewrite()
    yield
    activation.deactivate()


def ops_of(graph):
    return {op.type for op in graph.get_operations()}


def overflow_probe(x):
    """``x @ (2**10 ones)``: inf in float16 where x holds 2**10 values, exact in float32."""
    return tf.matmul(x, tf.constant(np.full([4, 1], BIG, np.float32)), name="probe_mm")


def test_reference_variables_train_and_read_in_half():
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.Variable(np.full([4, 1], BIG, np.float32), name="w")
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.matmul(x, w, name="y")
        loss = tf.reduce_mean(tf.square(y * 2.0 ** -12 - 1.0), name="loss")
        step = tf1.train.GradientDescentOptimizer(10.0).minimize(loss)
        init = tf1.global_variables_initializer()
    assert "VariableV2" in ops_of(graph) and w.dtype == tf.float32._as_ref  # premise: TF1 variables
    big = np.full([2, 4], BIG, np.float32)
    with tf1.Session(graph=graph) as session:
        assert isinstance(session, tfamp_rewrite.Session)
        session.run(init)
        assert np.isinf(session.run(y, {x: big})).all()          # the MatMul runs in half
        before = session.run(w)
        session.run(step, {x: np.full([2, 4], 0.5, np.float32)})  # Assign through float_ref edges
        after = session.run(w)
    assert after.dtype == np.float32 and not np.array_equal(before, after)
    with float32_session(graph) as plain:
        plain.run(init)
        assert np.isfinite(plain.run(y, {x: big})).all()


def test_switch_merge_conds_run_their_branches_in_half():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [1, 4], name="x")
        flag = tf1.placeholder(tf.bool, [], name="flag")
        out = tf.cond(flag, lambda: overflow_probe(x), lambda: tf.reduce_sum(x, 1, keepdims=True))
    assert {"Switch", "Merge"} <= ops_of(graph) and "If" not in ops_of(graph)
    big = np.full([1, 4], BIG, np.float32)
    with tf1.Session(graph=graph) as session:
        assert np.isinf(session.run(out, {x: big, flag: True})).all()
        assert session.run(out, {x: big, flag: False}) == 4 * BIG  # Sum: float32 (deny list)


def test_enter_exit_loops_run_their_body_in_half():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.constant(np.eye(4, dtype=np.float32) * 3.0)
        _, out = tf1.while_loop(lambda i, h: i < 7, lambda i, h: (i + 1, tf.matmul(h, w)), (0, x))
    assert {"Enter", "Exit", "NextIteration", "LoopCond"} <= ops_of(graph)
    ones = np.ones([4, 4], np.float32)
    with tf1.Session(graph=graph) as session:
        value = session.run(out, {x: ones * 0.25})
        overflowed = session.run(out, {x: ones * 64.0})  # 64 * 3**7 = 139968 > 65504
    np.testing.assert_allclose(value, ones * 0.25 * 3.0 ** 7, rtol=1e-3)
    assert np.isinf(overflowed).all()


def test_queue_runners_and_threads_calling_run_at_once():
    """Four enqueue threads fill a queue; three Python threads train from it concurrently."""
    steps_per_thread, threads = 20, 3
    graph = tf.Graph()
    with graph.as_default():
        queue = tf1.FIFOQueue(64, [tf.float32], shapes=[[4]])
        example = tf1.random_uniform([4], 0.5, 1.5)
        tf1.train.add_queue_runner(tf1.train.QueueRunner(queue, [queue.enqueue(example)] * 4))
        batch = queue.dequeue_many(8)
        w = tf1.get_variable("w", [4, 1], initializer=tf1.constant_initializer(0.1))
        loss = tf.reduce_mean(tf.square(tf.matmul(batch, w) - 1.0))
        # a scale no gradient overflows at, so that every one of the 60 steps is applied
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.05),
                                               tfamp_rewrite.DynamicLossScale(2.0 ** 8))
        train = opt.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        probe = overflow_probe(tf.fill([1, 4], BIG))
        init = tf1.global_variables_initializer()
    errors = []
    with tf1.Session(graph=graph) as session:
        session.run(init)
        coordinator = tf1.train.Coordinator()
        runners = tf1.train.start_queue_runners(session, coord=coordinator)
        assert len(runners) == 5  # four enqueue threads and the one that closes on stop

        def train_steps():
            try:
                for _ in range(steps_per_thread):
                    session.run(train)
            except Exception as error:  # noqa: BLE001 -- reported by the assertion below
                errors.append(error)

        workers = [threading.Thread(target=train_steps) for _ in range(threads)]
        first = session.run(loss)
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        last, global_step, probed = session.run([loss, tf1.train.get_global_step(), probe])
        coordinator.request_stop()
        coordinator.join(runners)
    assert not errors
    assert global_step == steps_per_thread * threads
    assert last < first and np.isinf(probed).all()


class _FetchEveryStep(tf1.train.SessionRunHook):
    """A hook that fetches the probe and the loss alongside every step."""

    def __init__(self, probe, loss):
        self.fetches = {"probe": probe, "loss": loss}
        self.seen = []

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self.fetches)

    def after_run(self, run_context, run_values):
        self.seen.append(run_values.results)


def _regression(graph):
    with graph.as_default():
        x = tf.constant(np.random.RandomState(0).uniform(0.5, 1.5, [16, 4]).astype(np.float32))
        w = tf1.get_variable("w", [4, 1], initializer=tf1.constant_initializer(0.1))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0), name="loss")
        opt = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.05), "dynamic")
        train = opt.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        return train, loss, overflow_probe(tf.fill([1, 4], BIG))


def test_monitored_training_session_hooks_see_the_half_graph(tmp_path):
    graph = tf.Graph()
    train, loss, probe = _regression(graph)
    hook = _FetchEveryStep(probe, loss)
    with graph.as_default():
        hooks = [hook, tf1.train.StopAtStepHook(last_step=12)]
        with tf1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path), hooks=hooks,
                                                save_checkpoint_steps=5) as session:
            while not session.should_stop():
                session.run(train)
    assert len(hook.seen) == 12
    # The hook's fetches ride on the rewritten training runs: the probe overflows float16 ...
    assert np.isinf(hook.seen[0]["probe"]).all()
    # ... and a training run returning inf/nan is traced and healed, as the loss would be.
    assert np.isfinite(hook.seen[-1]["probe"]).all()
    assert hook.seen[-1]["loss"] < hook.seen[0]["loss"]
    assert tf1.train.load_variable(str(tmp_path), "global_step") == 12


def test_supervisor_managed_session_trains_and_checkpoints(tmp_path):
    graph = tf.Graph()
    train, loss, probe = _regression(graph)
    with graph.as_default():
        supervisor = tf1.train.Supervisor(logdir=str(tmp_path), save_model_secs=0, save_summaries_secs=0)
        with supervisor.managed_session() as session:
            assert isinstance(session, tfamp_rewrite.Session)
            first = session.run(loss)
            for _ in range(10):
                session.run(train)
            last, probed = session.run([loss, probe])
            supervisor.saver.save(session, str(tmp_path / "model.ckpt"), global_step=supervisor.global_step)
    assert last < first and np.isinf(probed).all()
    assert tf1.train.load_variable(str(tmp_path / "model.ckpt-10"), "global_step") == 10


def test_saver_checkpoints_move_between_float32_and_amp_runs(tmp_path):
    """fp32 trains and saves; AMP restores, checks, trains and saves; fp32 restores that."""
    graph = tf.Graph()
    train, loss, probe = _regression(graph)
    with graph.as_default():
        saver = tf1.train.Saver()
        init = tf1.global_variables_initializer()
        (weights,) = tf1.trainable_variables()
    with float32_session(graph) as plain:
        plain.run(init)
        for _ in range(5):
            plain.run(train)
        float32_weights = plain.run(weights)
        first_path = saver.save(plain, str(tmp_path / "fp32.ckpt"))
    with tf1.Session(graph=graph) as amp:
        assert isinstance(amp, tfamp_rewrite.Session)
        saver.restore(amp, first_path)
        np.testing.assert_array_equal(amp.run(weights), float32_weights)
        assert np.isinf(amp.run(probe)).all()
        for _ in range(5):
            amp.run(train)
        amp_weights, amp_step = amp.run([weights, tf1.train.get_global_step()])
        second_path = saver.save(amp, str(tmp_path / "amp.ckpt"))
    assert amp_step == 10
    with float32_session(graph) as plain:
        saver.restore(plain, second_path)
        np.testing.assert_array_equal(plain.run(weights), amp_weights)
        assert plain.run(tf1.train.get_global_step()) == 10
        assert np.isfinite(plain.run(probe)).all()

"""A float32 checkpoint restores into a loss-scaled program, and back.

Mixed precision adds the loss scale's variables, so the program's Saver asks the float32
checkpoint for keys it never had.  The session restores everything the checkpoint has,
starts the loss scale from its initial state and says so once; any other missing key still
fails with TensorFlow's own error.
"""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from loss_scaling_problems import GOOD_STEPS, SCALE, build, global_state, initialized_session, run
from repo_paths import REPO, SCRIPTS

from tfamp_rewrite import LossScaleOptimizer
from tfamp_rewrite.training.session import Session

tf1 = tf.compat.v1
SAID = "without mixed precision's loss scaling"


@pytest.fixture(autouse=True)
def cpu_target(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")


def momentum():
    return tf1.train.MomentumOptimizer(0.1, 0.9)


def loss_scaled_momentum():
    return LossScaleOptimizer(momentum(), "dynamic")


def save(problem, session, path):
    with problem.graph.as_default():
        return tf1.train.Saver().save(session, path)


def restore(problem, session, path):
    with problem.graph.as_default():
        tf1.train.Saver().restore(session, path)
    return global_state(session)


def our_warnings(caplog):
    return [r.getMessage() for r in caplog.records if SAID in r.getMessage()]


def test_a_float32_checkpoint_restores_into_a_loss_scaled_session(tmp_path, caplog):
    fp32 = build(momentum)
    with initialized_session(fp32) as session:
        saved = run(fp32, [1.0, 1.0, 1.0], session=session)[-1]
        path = save(fp32, session, str(tmp_path / "fp32"))

    amp = build(loss_scaled_momentum)
    with Session(graph=amp.graph) as session:
        restored = restore(amp, session, path)
        for name, value in saved.items():   # weights, Momentum slots, global_step
            np.testing.assert_array_equal(restored[name], value, err_msg=name)
        assert (restored[SCALE], restored[GOOD_STEPS]) == (2.0 ** 15, 0)
        trained = run(amp, [1.0], session=session)[-1]
        amp_path = save(amp, session, str(tmp_path / "amp"))
    assert trained["global_step"] == saved["global_step"] + 1 and trained[GOOD_STEPS] == 1
    (message,) = our_warnings(caplog)
    assert repr(path) in message and SCALE in message and GOOD_STEPS in message, message
    assert "other %d variables" % len(saved) in message, message

    # Back to float32: TensorFlow's Saver restores what its graph asks for and no more.
    with tf1.Session(graph=fp32.graph) as session:
        back = restore(fp32, session, amp_path)
    assert back["global_step"] == trained["global_step"]


def test_a_missing_model_variable_still_fails_as_tensorflow_says(tmp_path, caplog):
    fp32 = build(momentum)
    with initialized_session(fp32) as session:
        path = save(fp32, session, str(tmp_path / "fp32"))
    amp = build(loss_scaled_momentum)
    with amp.graph.as_default():
        tf1.get_variable("added_later", [2])
    with Session(graph=amp.graph) as session:
        with pytest.raises(tf.errors.NotFoundError, match="added_later"):
            restore(amp, session, path)
    assert not our_warnings(caplog)


def test_a_saver_with_renamed_keys_restores_too(tmp_path, caplog):
    """``Saver({"model/" + name: variable})``: the loss scale is found by the variables the
    restore assigns, whatever the keys."""
    def renamed_saver(problem):
        with problem.graph.as_default():
            return tf1.train.Saver({"model/" + v.op.name: v for v in tf1.global_variables()})

    fp32 = build(momentum)
    with initialized_session(fp32) as session:
        saved = run(fp32, [1.0], session=session)[-1]
        path = renamed_saver(fp32).save(session, str(tmp_path / "fp32"))
    amp = build(loss_scaled_momentum)
    with Session(graph=amp.graph) as session:
        renamed_saver(amp).restore(session, path)
        restored = global_state(session)
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    assert (restored[SCALE], restored[GOOD_STEPS]) == (2.0 ** 15, 0)
    (message,) = our_warnings(caplog)
    assert "has no model/" + SCALE in message, message


def partitioned_problem(make_optimizer):
    """A [7, 2] weight in 3 partitions, saved by a sharded Saver (Estimator's kind)."""
    graph = tf.Graph()
    with graph.as_default():
        weight = tf1.get_variable("weight", [7, 2], partitioner=tf1.fixed_size_partitioner(3),
                                  initializer=tf1.random_normal_initializer(seed=1))
        features = tf.constant(np.arange(14, dtype=np.float32).reshape(2, 7) / 14)
        loss = tf.reduce_sum(tf.square(tf.matmul(features, tf.concat(list(weight), 0))))
        train_op = make_optimizer().minimize(loss)
        saver = tf1.train.Saver(sharded=True)
    return graph, train_op, saver


def test_partitioned_variables_of_a_sharded_saver_restore_their_slices(tmp_path, caplog):
    graph, train_op, saver = partitioned_problem(momentum)
    with tf1.Session(graph=graph) as session:
        session.run(tf1.variables_initializer(graph.get_collection("variables")))
        session.run(train_op)
        path = saver.save(session, str(tmp_path / "fp32"))
        saved = {v.op.name: session.run(v) for v in graph.get_collection("variables")}

    graph, train_op, saver = partitioned_problem(loss_scaled_momentum)
    with Session(graph=graph) as session:
        saver.restore(session, path)
        for variable in graph.get_collection("variables"):
            value = session.run(variable)
            if variable.op.name in saved:
                np.testing.assert_array_equal(value, saved[variable.op.name], err_msg=variable.op.name)
            else:
                assert "loss_scale" in variable.op.name
        session.run(train_op)
    assert len(our_warnings(caplog)) == 1


@pytest.mark.own_processes("unmodified TF1 programs in new processes")
def test_monitored_training_resumes_across_switching_amp_on_and_off(tmp_path):
    """MonitoredTrainingSession's checkpoints: float32, then zero-code AMP, then float32."""
    script = os.path.join(SCRIPTS, "resume_training.py")

    def train(until, amp):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_ENABLE_AUTO_MIXED", "TFAMP_"))}
        env.update(TFAMP_REWRITE_TARGET="cpu", TF_CPP_MIN_LOG_LEVEL="2")
        if amp:
            env["TF_ENABLE_AUTO_MIXED_PRECISION"] = "1"
        done = subprocess.run([sys.executable, script, str(tmp_path), str(until)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
        return json.loads(line[len("RESULT "):]), done.stderr

    first, _ = train(4, amp=False)
    second, said = train(8, amp=True)
    third, _ = train(12, amp=False)
    assert (first["started_at"], second["started_at"], third["started_at"]) == (0, 4, 8)
    assert third["finished_at"] == 12
    assert second["loss_scale"] == 2.0 ** 15 and first["loss_scale"] is None
    assert sum(SAID in line for line in said.splitlines()) == 1, said[-3000:]


@pytest.mark.parametrize("switched_on", ["loss scaling", "graph rewrite"])
def test_warm_starting_every_variable_from_a_float32_checkpoint_leaves_the_loss_scale_out(
        tmp_path, caplog, monkeypatch, switched_on):
    """``warm_start(dir, [".*"])`` -- the list form matches every global variable, Adam's slots
    included -- must not fail on the loss scale a float32 checkpoint cannot have."""
    from tfamp_rewrite.training import activation, devices

    monkeypatch.setattr(devices, "_logged", set())  # what this process already said once
    def adam_program(wrap):
        graph = tf.Graph()
        with graph.as_default():
            w = tf1.get_variable("w", initializer=np.full((3, 1), 0.5, np.float32))
            train = wrap(tf1.train.AdamOptimizer(0.1)).minimize(tf.reduce_sum(tf.square(w - 2.0)))
        return graph, train

    graph, train = adam_program(lambda opt: opt)
    with graph.as_default(), tf1.Session() as session:
        session.run(tf1.global_variables_initializer())
        session.run(train)
        saved = {v.op.name: session.run(v) for v in tf1.global_variables()}
        tf1.train.Saver().save(session, str(tmp_path / "fp32"))

    try:
        if switched_on == "loss scaling":
            activation.enable_loss_scaling()
            graph, train = adam_program(lambda opt: opt)
        else:
            activation.enable_graph_rewrite()
            graph, train = adam_program(LossScaleOptimizer)
        with graph.as_default():
            tf1.train.warm_start(str(tmp_path), vars_to_warm_start=[".*"])
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                warmed = {v.op.name: session.run(v) for v in tf1.global_variables()}
    finally:
        activation.deactivate()
    assert set(saved) < set(warmed)
    for name, value in saved.items():
        np.testing.assert_array_equal(warmed[name], value, err_msg=name)
    assert warmed["loss_scale/current_loss_scale"] == 2.0 ** 15
    said = [r.getMessage() for r in caplog.records if "warm start leaves the loss scale" in r.getMessage()]
    assert len(said) == 1 and "loss_scale/current_loss_scale" in said[0]


@pytest.mark.parametrize("var_list", ["trainable and global_step", "every variable", "weights only"])
def test_a_saver_leaving_the_loss_scale_out_is_said_once(tmp_path, caplog, monkeypatch, var_list):
    """Saver(tf.trainable_variables() + [global_step]) writes no loss-scale state: each
    process resuming from it started the scale again and skipped its steps anew, unsaid.
    A weights-only export (no global_step, no slots) is no checkpoint to resume from."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=[1.0, 2.0])
        step = tf1.train.get_or_create_global_step()
        train = loss_scaled_momentum().minimize(tf.reduce_sum(w * w), global_step=step)
        saved = {"trainable and global_step": tf1.trainable_variables() + [step],
                 "every variable": None, "weights only": tf1.trainable_variables()}[var_list]
        saver = tf1.train.Saver(saved)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        session.run(train)
        for index in range(2):
            saver.save(session, str(tmp_path / "model"), global_step=index)
    said = [r.getMessage() for r in caplog.records
            if "a Saver saves none of the loss scale's" in r.getMessage()]
    assert len(said) == (1 if var_list == "trainable and global_step" else 0)
    assert all("'loss_scale/current_loss_scale'" in line and "opt.variables()" in line for line in said)


@pytest.mark.parametrize("driver", ["session", "monitored"])
def test_a_saver_of_the_trainable_variables_resumes_with_the_loss_scale_initialized(
        tmp_path, caplog, monkeypatch, driver):
    """A restarted job whose Saver keeps the trainable variables and global_step: the restore
    left the loss scale uninitialized, and the resumed job failed on it (a
    MonitoredTrainingSession refused the session as not ready). The session initializes
    it after the restore, and says so once."""
    def job():
        graph = tf.Graph()
        with graph.as_default():
            w = tf.compat.v1.get_variable("w", [4, 1])
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.ones([8, 4]), w) - 1.0))
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train = LossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic").minimize(
                loss, global_step=global_step)
            saver = tf.compat.v1.train.Saver(tf.compat.v1.trainable_variables() + [global_step])
            latest = tf.train.latest_checkpoint(str(tmp_path))
            if driver == "monitored":
                scaffold = tf.compat.v1.train.Scaffold(saver=saver)
                with tf.compat.v1.train.MonitoredTrainingSession(
                        checkpoint_dir=str(tmp_path), scaffold=scaffold, save_checkpoint_steps=5,
                        save_summaries_steps=None) as session:
                    for _ in range(5):
                        session.run(train)
                    return session.run(global_step)
            with Session(graph=graph) as session:
                if latest:
                    saver.restore(session, latest)
                else:
                    session.run(tf.compat.v1.global_variables_initializer())
                for _ in range(5):
                    session.run(train)
                saver.save(session, str(tmp_path / "model"), global_step=global_step)
                return session.run(global_step)

    from tfamp_rewrite.training import activation, devices

    monkeypatch.setattr(devices, "_logged", set())
    if driver == "monitored":
        activation.enable_graph_rewrite()
    try:
        first = job()
        with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
            second = job()
    finally:
        activation.deactivate()
    assert second > first > 0
    said = [r.getMessage() for r in caplog.records if "restore left the loss scale" in r.getMessage()]
    assert len(said) == 1 and "'loss_scale/current_loss_scale'" in said[0]

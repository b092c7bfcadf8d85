"""Object-based checkpoints (``tf.compat.v1.train.Checkpoint``) of loss-scaled optimizers.

They hold what the wrapped optimizer's checkpoint holds, under the same keys (slots, and
Adam's ``beta1_power``/``beta2_power``), plus the loss scale: a resumed run starts from the
scale it had, not from 2**15, whether the optimizer was wrapped explicitly or by automatic
loss scaling, and whether the restore is asked for before or after the training op exists.
"""
import numpy as np
import pytest
import tensorflow as tf

from tfamp_rewrite import LossScaleOptimizer
from tfamp_rewrite.training import activation

tf1 = tf.compat.v1
ONES, INFS = np.ones((2, 3), np.float32), np.full((2, 3), np.inf, np.float32)
SCALE_KEY = "opt/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE"


@pytest.fixture(autouse=True)
def switched_off_afterwards():
    yield
    activation.deactivate()


def program(wrap, restore_from=None):
    """``x @ w`` trained by Adam (wrapped by ``wrap``), its Checkpoint(opt, w); a restore from
    ``restore_from`` is asked for before the training op is built."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 3], name="x")
        w = tf1.get_variable("w", initializer=np.full((3, 1), 0.5, np.float32))
        opt = wrap(tf1.train.AdamOptimizer(0.1))
        checkpoint = tf1.train.Checkpoint(opt=opt, w=w)
        status = checkpoint.restore(restore_from) if restore_from else None
        train = opt.minimize(tf.reduce_sum(tf.square(tf.matmul(x, w))))
        init = tf1.global_variables_initializer()
        state = {v.op.name: v for v in tf1.global_variables()
                 if v.op.name in ("w", "w/Adam", "beta1_power", "loss_scale/current_loss_scale")}
    return graph, x, train, init, checkpoint, status, state


def explicit(opt):
    return LossScaleOptimizer(opt, "dynamic")


def automatic(opt):
    activation.enable_loss_scaling()
    return opt


@pytest.mark.parametrize("wrap", [explicit, automatic])
@pytest.mark.parametrize("restore_asked", ["after building", "before building"])
def test_a_resumed_run_starts_from_the_saved_loss_scale_and_optimizer_state(tmp_path, wrap, restore_asked):
    graph, x, train, init, checkpoint, _, state = program(wrap)
    with tf1.Session(graph=graph) as session:
        session.run(init)
        for value in (ONES, INFS, ONES):  # the inf step halves the scale
            session.run(train, {x: value})
        saved = session.run(state)
        path = checkpoint.save(str(tmp_path / "ckpt"), session=session)
    assert saved["loss_scale/current_loss_scale"] == 2.0 ** 14
    keys = dict(tf1.train.list_variables(path))
    assert {SCALE_KEY, "opt/good_steps/.ATTRIBUTES/VARIABLE_VALUE",
            "opt/beta1_power/.ATTRIBUTES/VARIABLE_VALUE",
            "w/.OPTIMIZER_SLOT/opt/m/.ATTRIBUTES/VARIABLE_VALUE"} <= set(keys)

    early = path if restore_asked == "before building" else None
    graph, x, train, init, checkpoint, status, state = program(wrap, restore_from=early)
    with tf1.Session(graph=graph) as session:
        session.run(init)
        (status or checkpoint.restore(path)).run_restore_ops(session)
        restored = session.run(state)
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def test_a_float32_checkpoint_restores_into_a_loss_scaled_optimizer_by_the_same_keys(tmp_path):
    graph, x, train, init, checkpoint, _, state = program(lambda opt: opt)
    with tf1.Session(graph=graph) as session:
        session.run(init)
        session.run(train, {x: ONES})
        path = checkpoint.save(str(tmp_path / "fp32"), session=session)
        saved = session.run(state)
    graph, x, train, init, checkpoint, _, state = program(explicit)
    with tf1.Session(graph=graph) as session:
        session.run(init)
        checkpoint.restore(path).run_restore_ops(session)
        restored = session.run(state)
    assert saved["beta1_power"] != 0.9  # not its initial value
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    assert restored["loss_scale/current_loss_scale"] == 2.0 ** 15  # not in the checkpoint: its start

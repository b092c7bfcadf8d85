"""The process-wide switches: sessions that rewrite and optimizers that scale themselves."""
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1

import tfamp_rewrite
from tfamp_rewrite.training import activation
from tfamp_rewrite.training.session import TF_SESSION_CLASSES

tf1 = tf.compat.v1
BIG = 2.0 ** 10


@pytest.fixture(autouse=True)
def restore_tensorflow(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    yield
    activation.deactivate()


def probe(graph):
    """A MatMul that overflows only in float16, fetched through an Identity."""
    with graph.as_default():
        x = tf.constant(np.full([1, 4], BIG, np.float32))
        return tf.identity(tf.matmul(x, tf.constant(np.full([4, 1], BIG, np.float32))), name="probe")


MAIN, REWRITE, SCALING = ("TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE",
                           "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING")


@pytest.mark.parametrize("environ,rewrite,scaling", [
    ({}, False, False),
    ({MAIN: "1"}, True, True),
    ({MAIN: "true"}, True, False),  # NVIDIA: loss scaling only for "1"
    ({MAIN: "1", REWRITE: "0"}, False, True),
    ({REWRITE: "1"}, True, False),
    ({MAIN: "1", SCALING: "0"}, True, False),
    ({SCALING: "1"}, False, True),
])
def test_nvidia_environment_rules(environ, rewrite, scaling):
    assert activation.graph_rewrite_requested(environ) is rewrite
    assert activation.loss_scaling_requested(environ) is scaling


def test_a_malformed_switch_is_a_clear_error():
    with pytest.raises(ValueError, match="TF_ENABLE_AUTO_MIXED_PRECISION='yes please' is not a boolean"):
        activation.graph_rewrite_requested({"TF_ENABLE_AUTO_MIXED_PRECISION": "yes please"})


def test_enabling_makes_new_tensorflow_sessions_rewrite_and_disabling_undoes_it():
    graph = tf.Graph()
    out = probe(graph)
    activation.enable_graph_rewrite()
    with tf1.Session(graph=graph) as session:
        assert isinstance(session, tfamp_rewrite.Session)
        assert isinstance(session, TF_SESSION_CLASSES["Session"])
        assert np.isinf(session.run(out)).all()
    interactive = tf1.InteractiveSession(graph=graph)
    assert isinstance(interactive, tfamp_rewrite.InteractiveSession)
    interactive.close()
    activation.disable_graph_rewrite()
    with tf1.Session(graph=graph) as session:
        assert type(session) is TF_SESSION_CLASSES["Session"]
        assert np.isfinite(session.run(out)).all()


def test_monitored_training_session_trains_with_amp(tmp_path):
    graph = tf.Graph()
    out = probe(graph)
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 1], initializer=tf1.ones_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
        opt = tfamp_rewrite.enable_mixed_precision_graph_rewrite(tf1.train.GradientDescentOptimizer(0.1))
        train = opt.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        feed = {x: np.full([8, 4], 0.5, np.float32)}
        with tf1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path)) as session:
            assert np.isinf(session.run(out)).all()  # half kernels inside the monitored session
            first = session.run(loss, feed)
            for _ in range(20):
                session.run(train, feed)
            assert session.run(loss, feed) < first
    names = [name for name, _ in tf1.train.list_variables(str(tmp_path))]
    assert "loss_scale/current_loss_scale" in names


@pytest.mark.skipif(not hasattr(tf1, "estimator"), reason="this TensorFlow has no Estimator (gone in 2.16)")
def test_estimator_trains_with_amp(tmp_path):
    def model_fn(features, labels, mode):
        logits = tf1.layers.dense(features["x"], 3, name="logits")
        if mode == tf1.estimator.ModeKeys.PREDICT:
            with tf.control_dependencies([logits]):
                probe_value = tf.matmul(tf.fill([1, 4], BIG), tf.fill([4, 1], BIG))
            probes = tf.tile(probe_value, [tf.shape(logits)[0], 1])
            return tf1.estimator.EstimatorSpec(mode, predictions={"probe": probes})
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        opt = tfamp_rewrite.enable_mixed_precision_graph_rewrite(tf1.train.GradientDescentOptimizer(0.5))
        return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
            loss, global_step=tf1.train.get_or_create_global_step()))

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)

    def input_fn():
        return tf1.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(16)

    estimator = tf1.estimator.Estimator(model_fn, model_dir=str(tmp_path))
    estimator.train(input_fn, steps=30)
    names = [name for name, _ in tf1.train.list_variables(str(tmp_path))]
    assert "loss_scale/current_loss_scale" in names  # loss scale lives in the loss's graph
    prediction = next(estimator.predict(lambda: tf1.data.Dataset.from_tensor_slices({"x": x}).batch(4)))
    assert np.isinf(prediction["probe"]).all()  # the predict session ran half kernels


def _train_step_graph(wrap=None, make_optimizer=lambda: tf1.train.MomentumOptimizer(0.1, 0.9)):
    graph = tf.Graph()
    with graph.as_default():
        scale_input = tf1.placeholder(tf.float32, [], name="scale_input")
        w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
        loss = tf.reduce_sum(w * w) * scale_input
        opt = make_optimizer()
        if wrap:
            opt = wrap(opt)
        train = opt.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        init = tf1.global_variables_initializer()
    return graph, train, init, w, scale_input


def test_automatic_loss_scaling_skips_non_finite_steps():
    activation.enable_loss_scaling()
    graph, train, init, w, scale_input = _train_step_graph()
    with graph.as_default():
        scales = [v for v in tf1.global_variables() if "current_loss_scale" in v.name]
        step = tf1.train.get_global_step()
    assert len(scales) == 1
    with tf1.Session(graph=graph) as session:
        session.run(init)
        session.run(train, {scale_input: np.inf})
        np.testing.assert_array_equal(session.run(w), [1.0, 1.0])
        assert session.run(step) == 0 and session.run(scales[0]) == 2 ** 14
        session.run(train, {scale_input: 1.0})
        assert session.run(step) == 1 and (session.run(w) < 1.0).all()


def test_automatic_loss_scaling_is_said_once_when_an_optimizer_first_scales(monkeypatch, caplog):
    """Said when the graph is built, not at the first skipped step, which may never come; an
    optimizer wrapped by the user, who knows it scales, says nothing."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    activation.enable_loss_scaling()

    def said():
        return [r.getMessage() for r in caplog.records if "automatic loss scaling is on" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        _train_step_graph(wrap=tfamp_rewrite.LossScaleOptimizer)
        assert not said()
        _train_step_graph()
        _train_step_graph()  # a second graph, another optimizer: once per process
        _train_step_graph(make_optimizer=lambda: tf1.train.AdamOptimizer(0.1))  # another class
    (line,) = said()
    assert "'Momentum' (MomentumOptimizer)" in line and "from 32768" in line and "2000 finite" in line
    assert "fed otherwise are applied as given" in line  # an evolution strategy's estimate
    # the summary it adds to merge_all, which a GAN's two optimizers each add one of
    assert "'current_loss_scale', then 'current_loss_scale_1'" in line


@pytest.mark.parametrize("later", ["GradientDescent", "Adam", "Adam, all initialized"])
def test_an_optimizer_built_after_the_first_run_trains_without_initializing_its_loss_scale(
        monkeypatch, caplog, later):
    """EWC's reference code builds a GradientDescentOptimizer for each task's objective after
    global_variables_initializer: float32 needs no initializer for it, and under automatic
    loss scaling its step failed on an uninitialized loss scale.  A later Adam needs the
    program's own initializer, which then initializes the loss scale again, harmlessly."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.ones([8, 4], np.float32))
        w = tf1.Variable(tf.ones([4, 1]), name="w")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
        first = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(first)
        with graph.as_default():
            optimizer = getattr(tf1.train, later.split(",")[0] + "Optimizer")(0.01)
            second = optimizer.minimize(loss + 0.1 * tf.reduce_sum(tf.square(w)))
            scales = [v for v in optimizer.variables() if "current_loss_scale" in v.name]
            slots = tf1.variables_initializer([v for v in optimizer.variables() if v not in scales])
            everything = tf1.variables_initializer(optimizer.variables())  # the scale's too
        if later == "Adam":
            session.run(slots)
        elif later == "Adam, all initialized":
            session.run(everything)
        before = session.run(w)
        for _ in range(6):
            session.run(second)
        assert (session.run(w) != before).all()  # steps applied once the scale fell
        assert 1 <= session.run(scales)[0] < 2.0 ** 15
    said = [r.getMessage() for r in caplog.records
            if "the session initialized the loss scale" in r.getMessage()]
    if later == "Adam, all initialized":  # the program's initializer ran: nothing to say
        assert said == []
        return
    assert len(said) == 1 and "('%s')" % scales[0].op.name in said[0]


def _program_scaled_regression(scale_by, through):
    """A regression whose program scales its loss itself (``scale_by``: "constant", 65536,
    or "variable", a non-trainable 32768 its code would halve and double) and divides the
    gradients by it (``through``: "compute_gradients" or "tf.gradients")."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.random.default_rng(0).standard_normal([64, 8]).astype(np.float32))
        pred = tf1.layers.dense(x, 1, kernel_initializer=tf1.constant_initializer(0.3))
        loss = tf.reduce_mean(tf.square(pred - 1.0))
        if scale_by == "constant":
            scale = tf.constant(65536.0)
        else:
            scale = tf1.Variable(32768.0, trainable=False, name="my_loss_scale")
        scaled_loss = loss * scale
        opt = tf1.train.GradientDescentOptimizer(0.1)
        variables = tf1.trainable_variables()
        if through == "compute_gradients":
            grads = [g for g, _ in opt.compute_gradients(scaled_loss, variables)]
        else:
            grads = tf.gradients(scaled_loss, variables)
        step = tf1.train.get_or_create_global_step()
        train = opt.apply_gradients([(g / scale, v) for g, v in zip(grads, variables)], step)
        init = tf1.global_variables_initializer()
    return graph, train, loss, step, init


@pytest.mark.parametrize("scale_by", ["constant", "variable"])
@pytest.mark.parametrize("through", ["compute_gradients", "tf.gradients"])
def test_a_loss_the_program_scales_itself_is_not_scaled_again(monkeypatch, caplog, scale_by, through):
    """compute_gradients(loss * 65536) was scaled again from 32768: the product overflowed,
    13 steps skipped before it fit, and the settled line advised a scale of 4.  tf.gradients
    of such a loss was said to be 'unscaled'.  The optimizer's scale now stays at 1, said
    once, and training runs as float32's does: every step applied, the same loss."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph, train, loss, step, init = _program_scaled_regression(scale_by, through)
    with tf1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(20):
            session.run(train)
        expected = session.run(loss)
    activation.enable_loss_scaling()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        graph, train, loss, step, init = _program_scaled_regression(scale_by, through)
        with tf1.Session(graph=graph) as session:
            session.run(init)
            for _ in range(20):
                session.run(train)
            assert session.run(step) == 20
            np.testing.assert_allclose(session.run(loss), expected, rtol=1e-5)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("computed from an unscaled loss" in m for m in messages)
    factor = "65536" if scale_by == "constant" else "the variable 'my_loss_scale'"
    owned = [m for m in messages
             if "is multiplied by %s already, the program's own loss scaling" % factor in m]
    assert len(owned) == (1 if through == "compute_gradients" else 0)


class _PCGradLike(tf1.train.GradientDescentOptimizer):
    """PCGrad's reference pattern: a compute_gradients of its own, calling tf.gradients."""

    def compute_gradients(self, loss, var_list=None, **kwargs):
        var_list = var_list or tf1.trainable_variables()
        return list(zip(tf.gradients(loss, var_list), var_list))


def test_an_optimizer_with_its_own_compute_gradients_is_told_where_its_loss_goes_unscaled(
        monkeypatch, caplog):
    """The program calls opt.compute_gradients: the line told it to use compute_gradients."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    activation.enable_loss_scaling()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        _train_step_graph(make_optimizer=lambda: _PCGradLike(0.1))
    (line,) = [r.getMessage() for r in caplog.records if "unscaled loss" in r.getMessage()]
    assert "_PCGradLike.compute_gradients is the program's own" in line
    assert "super().compute_gradients" in line and "rather than compute_gradients" not in line


class _LarsLike(tf1.train.Optimizer):
    """SimCLR's LARS pattern: an apply_gradients of its own that makes its momentum with
    tf.get_variable and assigns the new values, calling no apply_gradients."""

    def __init__(self, learning_rate):
        super().__init__(False, "LARS")
        self.learning_rate = learning_rate

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        updates = []
        for grad, var in grads_and_vars:
            momentum = tf1.get_variable(var.op.name + "/Momentum", var.shape, tf.float32,
                                        tf1.zeros_initializer(), trainable=False)
            step = 0.9 * momentum + grad * self.learning_rate / (tf.norm(grad) + 1e-6)
            updates += [var.assign_sub(step), momentum.assign(step)]
        if global_step is not None:
            updates.append(global_step.assign_add(1))
        return tf.group(*updates, name=name)


def test_an_optimizer_assigning_in_its_own_apply_gradients_skips_non_finite_steps_too():
    """minimize() scaled the loss through the base compute_gradients, and the override
    applied inf/nan gradients unchecked: the weights became NaN for good."""
    activation.enable_loss_scaling()
    graph, train, init, w, scale_input = _train_step_graph(make_optimizer=lambda: _LarsLike(0.1))
    with graph.as_default():
        step = tf1.train.get_global_step()
    with tf1.Session(graph=graph) as session:
        session.run(init)
        session.run(train, {scale_input: 1.0})
        applied = session.run(w)
        session.run(train, {scale_input: np.inf})  # inf gradients: this step is skipped
        np.testing.assert_array_equal(session.run(w), applied)
        assert session.run(step) == 1
        session.run(train, {scale_input: 1.0})
        assert np.isfinite(session.run(w)).all() and session.run(step) == 2


def test_an_optimizer_assigning_in_its_own_apply_gradients_still_takes_unscaled_gradients():
    """BERT's script: tf.gradients of the unscaled loss, then the override's apply_gradients,
    applied as they are (the session says once that they are unscaled)."""
    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
        opt = _LarsLike(0.1)
        grads = tf.gradients(tf.reduce_sum(w * w), [w])
        train = opt.apply_gradients(zip(grads, [w]))
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as session:
        session.run(init)
        session.run(train)
        assert (session.run(w) < 1.0).all()
    assert not [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES) if "loss_scale" in v.name]


def test_an_automatically_scaled_optimizers_variables_include_the_loss_scale():
    """``variables_initializer(opt.variables())`` (the TF1 idiom, and Keras' initialisation
    of a ``tf.compat.v1.train`` optimizer) must cover the loss scale the optimizer added."""
    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=[1.0, 1.0])
        opt = tf1.train.AdamOptimizer(0.1)
        train = opt.minimize(tf.reduce_sum(w * w))
        names = sorted(v.op.name for v in opt.variables())
        init = [w.initializer, tf1.variables_initializer(opt.variables())]
    assert names == ["beta1_power", "beta2_power", "loss_scale/current_loss_scale",
                     "loss_scale/good_steps", "w/Adam", "w/Adam_1"]
    with tf1.Session(graph=graph) as session:
        session.run(init)
        session.run(train)
        assert (session.run(w) < 1.0).all()


@pytest.mark.parametrize("built", ["before switching on", "after switching on", "with its own scale",
                                   "with TensorFlow's fixed scale"])
def test_a_graph_trained_without_loss_scaling_is_said_once(monkeypatch, caplog, built):
    """Loss scaling wraps tf.compat.v1.train optimizers; a graph updated by another (a Keras
    optimizer, or one built before loss scaling was switched on) is named once, with an
    update op, by the first run that updates.  One with a loss scale of its own (Keras'
    LossScaleOptimizer, TensorFlow's with a FixedLossScale, which has no variable) is not;
    runs that only read the graph (serving it) are not."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    if built != "before switching on":
        activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=[1.0, 1.0])
        loss = tf.reduce_sum(w * w)
        opt = tf1.train.GradientDescentOptimizer(0.1)
        if built == "with TensorFlow's fixed scale":
            opt = tf1.train.experimental.MixedPrecisionLossScaleOptimizer(
                opt, tf1.train.experimental.FixedLossScale(256))
        train = opt.minimize(loss)
        if built == "with its own scale":
            tf1.get_variable("keras/loss_scale", initializer=1.0)
        init = tf1.global_variables_initializer()
    activation.enable_loss_scaling()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            session.run(loss)
            assert not [r for r in caplog.records if "without loss scaling" in r.getMessage()]
            session.run(train)
            session.run(train)
    warnings = [r.getMessage() for r in caplog.records if "without loss scaling" in r.getMessage()]
    if built == "before switching on":
        assert len(warnings) == 1, warnings
        update = r"1 update op\(s\) \(e.g. 'GradientDescent/update_w/(Resource)?ApplyGradientDescent'"
        assert re.search(update, warnings[0]), warnings[0]
    else:
        assert not warnings


def test_an_unscaled_optimizer_beside_a_loss_scaled_one_is_said(monkeypatch, caplog):
    """Two Keras models in one graph, one compiled with a tf.compat.v1.train optimizer (loss
    scaled), one with a Keras optimizer (not): the second one's run is named."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=[1.0, 1.0])
        v = tf1.get_variable("v", initializer=[1.0, 1.0])
        unscaled = tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(v * v))
        activation.enable_loss_scaling()
        scaled = tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(w * w))
        init = tf1.global_variables_initializer()
    warning = unscaled_training_warning(caplog, graph, init, quiet=scaled, trains=unscaled)
    assert "1 update op(s) (e.g. 'GradientDescent/update_v/" in warning


def unscaled_training_warning(caplog, graph, init, quiet, trains) -> str:
    """Runs ``init`` and ``quiet`` in a session of ``graph`` (no 'without loss scaling'
    warning may come), then ``trains``; returns the one warning that comes."""
    def said():
        return [r.getMessage() for r in caplog.records if "without loss scaling" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(quiet)
        assert not said()
        session.run(trains)
    (warning,) = said()
    return warning


@pytest.mark.parametrize("update, scope", [("assign", ""), ("assign_sub", ""),
                                           ("assign_sub", "training/RMSprop")])
def test_an_optimizer_assigning_its_own_updates_is_said_to_train_unscaled(monkeypatch, caplog, update,
                                                                          scope):
    """BERT's AdamWeightDecayOptimizer overrides apply_gradients and assigns the new values,
    from gradients tf.gradients computed: nothing wraps it, so its run must be named."""
    from tfamp_rewrite.training import devices

    class AssigningOptimizer(tf1.train.Optimizer):
        def __init__(self):
            super().__init__(False, "Assigning")

        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            return tf.group(*[getattr(v, update)(g * 0.1 if update == "assign_sub" else v - 0.1 * g)
                              for g, v in grads_and_vars], name=name)

    monkeypatch.setattr(devices, "_logged", set())
    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=[1.0, 1.0])
        counter = tf1.get_variable("counter", initializer=0.0, trainable=False)
        loss = tf.reduce_sum(w * w)
        with tf1.name_scope(scope or None):  # Keras' RMSprop, Nadam: training/RMSprop/gradients/
            grads = tf.gradients(loss, [w])
        train = AssigningOptimizer().apply_gradients(zip(grads, [w]))
        count = counter.assign_add(1.0)  # an assignment, but no update: not from a gradient
        init = tf1.global_variables_initializer()
    warning = unscaled_training_warning(caplog, graph, init, quiet=count, trains=train)
    assert "1 update op(s)" in warning and "as BERT's does" in warning
    assert "an update written by hand from tf.gradients (gradient ascent on an input variable) " \
           "needs no optimizer: multiply the loss by a constant" in warning


def test_an_explicitly_wrapped_optimizer_is_scaled_once():
    activation.enable_loss_scaling()
    graph, *_ = _train_step_graph(wrap=tfamp_rewrite.LossScaleOptimizer)
    with graph.as_default():
        assert len([v for v in tf1.global_variables() if "current_loss_scale" in v.name]) == 1


def test_a_subclass_overriding_compute_and_apply_through_super_runs_each_once():
    """A subclass's compute_gradients / apply_gradients calling super() reach automatic loss
    scaling from inside the override: it must not call the override again on scaled values."""
    calls = {"compute": 0, "apply": 0}

    class WeightDecayTimesTwo(tf1.train.GradientDescentOptimizer):
        def compute_gradients(self, loss, var_list=None, **kwargs):
            calls["compute"] += 1
            pairs = super().compute_gradients(loss, var_list=var_list, **kwargs)
            return [(tf.clip_by_norm(g, 1.0) + 0.5 * v, v) for g, v in pairs]

        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            calls["apply"] += 1
            return super().apply_gradients([(g * 2.0, v) for g, v in grads_and_vars], global_step, name)

    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=[1.0])
        train = WeightDecayTimesTwo(0.1).minimize(tf.reduce_sum(w * 3.0))  # gradient 3, clipped to 1
        init = tf1.global_variables_initializer()
    assert calls == {"compute": 1, "apply": 1}
    with tf1.Session(graph=graph) as session:
        session.run(init)
        session.run(train)
        np.testing.assert_allclose(session.run(w), [1.0 - 0.1 * 2 * (1.0 + 0.5)], rtol=1e-6)


def test_tensorflows_own_loss_scale_optimizer_is_scaled_once(monkeypatch, caplog):
    """NVIDIA's docs told TF1 users to call TensorFlow's enable_mixed_precision_graph_rewrite,
    often with TF_ENABLE_AUTO_MIXED_PRECISION=1 set as well: scaled twice (2**15 * 2**15), the
    optimizer it wraps overflowed at every step and training froze."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    activation.enable_loss_scaling()

    def tensorflows(opt):
        return tf1.train.experimental.MixedPrecisionLossScaleOptimizer(opt, "dynamic")

    graph, train, init, w, scale_input = _train_step_graph(wrap=tensorflows)
    with graph.as_default():
        scales = [v.op.name for v in tf1.global_variables() if "current_loss_scale" in v.name]
        step = tf1.train.get_global_step()
    assert scales == ["current_loss_scale"]  # TensorFlow's; none of ours inside it
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), tf1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(3):
            session.run(train, {scale_input: 1.0})
        assert session.run(step) == 3 and session.run(w)[0] < 1.0
    (line,) = [r.getMessage() for r in caplog.records if "MixedPrecisionLossScaleOptimizer" in r.getMessage()]
    assert "leaves that optimizer alone" in line


def test_deactivate_restores_tensorflow_exactly():
    optimizer_class = tf1.train.Optimizer
    originals = {name: optimizer_class.__dict__[name]
                 for name in ("compute_gradients", "apply_gradients", "variables")}
    activation.enable_graph_rewrite()
    activation.enable_loss_scaling()
    assert optimizer_class.__dict__["compute_gradients"] is not originals["compute_gradients"]
    activation.deactivate()
    for name, method in originals.items():
        assert optimizer_class.__dict__[name] is method
    with tf1.Session(graph=tf.Graph()) as session:
        assert type(session) is TF_SESSION_CLASSES["Session"]
    assert not activation.graph_rewrite_enabled() and not activation.loss_scaling_enabled()


@pytest.mark.parametrize("use", ["adversarial_example", "counted_by_a_metric", "kept_in_a_variable",
                                 "scaled_by_the_user", "training_step", "accumulated_then_applied",
                                 "hessian_vector_product"])
def test_gradients_used_as_values_in_float16_are_said_once(monkeypatch, caplog, use):
    """FGSM: tf.gradients(loss, x) in float16 with no loss scale loses its small entries; the
    first run computing it says so -- also where a metric counts the attack's hits or a
    non-trainable variable keeps the perturbation, which update no model (their writes hid
    it).  Not when the user followed the advice (the loss times 1024), nor for the same
    model's loss-scaled training step, whose gradients an optimizer applies, nor for
    gradients accumulated into a variable that a step applies."""
    from tfamp_rewrite.training import devices

    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setattr(devices, "_logged", set())
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 16], name="x")
        y = tf1.placeholder(tf.int32, [8], name="y")
        w = tf1.get_variable("w", initializer=(rng.standard_normal([16, 4]) * 0.5).astype(np.float32))
        loss = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.matmul(x, w)))
        if use in ("adversarial_example", "scaled_by_the_user"):
            scale = 1024.0 if use == "scaled_by_the_user" else 1.0  # the warning's advice
            (gradient,) = tf1.gradients(loss * scale if scale != 1.0 else loss, [x])
            fetch = tf.stop_gradient(x + 0.1 * tf.sign(gradient))
        elif use == "counted_by_a_metric":
            (gradient,) = tf1.gradients(loss, [x])
            adversarial = tf.matmul(x + 0.1 * tf.sign(gradient), w)
            _, fetch = tf1.metrics.accuracy(y, tf.argmax(adversarial, 1))
        elif use == "kept_in_a_variable":
            (gradient,) = tf1.gradients(loss, [x])
            delta = tf1.get_variable("delta", [8, 16], trainable=False, initializer=tf1.zeros_initializer())
            fetch = tf1.assign(delta, 0.1 * tf.sign(gradient))
        elif use == "hessian_vector_product":  # two calls in one run: both named, both kept
            (gradient,) = tf1.gradients(loss, [w])
            (fetch,) = tf1.gradients(tf.reduce_sum(gradient * tf.ones_like(w)), [w])
        elif use == "accumulated_then_applied":  # over runs, into a variable a step applies
            (gradient,) = tf1.gradients(loss, [w])
            total = tf1.get_variable("total", [16, 4], trainable=False, initializer=tf1.zeros_initializer())
            fetch = tf1.assign_add(total, gradient)
            tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1)).apply_gradients(
                [(total / 2.0, w)])
        else:
            fetch = tfamp_rewrite.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
        init = [tf1.global_variables_initializer(), tf1.local_variables_initializer()]
    feed = {x: rng.standard_normal([8, 16]).astype(np.float32), y: np.zeros(8, np.int32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            session.run(loss, feed)
            assert "uses them as values" not in caplog.text   # the forward pass alone
            for _ in range(2):
                session.run(fetch, feed)
    said = [r.getMessage() for r in caplog.records if "uses them as values" in r.getMessage()]
    assert len(said) == (0 if use in ("scaled_by_the_user", "training_step", "accumulated_then_applied")
                         else 1), said
    # and it tells a flushed gradient from one a perturbation below half's resolution zeroes
    assert all("VAT's x + 1e-6 * d" in line for line in said)
    # the setting that keeps the call float32 comes first, with the call's own scope
    setting = "'^gradients/,^gradients_1/'" if use == "hessian_vector_product" else "'^gradients/'"
    assert all("TFAMP_REWRITE_NODES_TO_EXCLUDE=%s (the forward pass" % setting in line for line in said)


def test_a_saliency_map_of_an_imported_training_graph_is_said(monkeypatch, caplog):
    """tf.gradients after import_meta_graph of a training graph reuses its 'gradients' scope
    (seeds 'grad_ys_0_1'), so the saliency map's backprop was taken for the training one,
    which reaches Adam's updates, and its flushed entries were unsaid."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    rng = np.random.RandomState(0)
    trained = tf.Graph()
    with trained.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        logits = tf1.layers.dense(tf1.layers.dense(x, 32, tf.nn.relu, name="h"), 4, name="logits")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        tf1.train.AdamOptimizer(1e-2).minimize(tf1.losses.sparse_softmax_cross_entropy(labels, logits))
        exported = tf1.train.export_meta_graph()
    explained = tf.Graph()
    with explained.as_default():
        tf1.train.import_meta_graph(exported)
        x = explained.get_tensor_by_name("x:0")
        probability = tf.reduce_max(tf.nn.softmax(explained.get_tensor_by_name("logits/BiasAdd:0")), 1)
        (saliency,) = tf1.gradients(probability, x)
        init = tf1.global_variables_initializer()
    assert "_1" in [op.name for op in explained.get_operations() if "grad_ys_" in op.name][-1]
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=explained) as session:
            session.run(init)
            session.run(saliency, {x: rng.standard_normal([8, 16]).astype(np.float32)})
    assert len([r for r in caplog.records if "uses them as values" in r.getMessage()]) == 1


def test_an_imported_float32_train_op_is_told_to_rebuild_its_optimizer(monkeypatch, caplog):
    """import_meta_graph of a float32 training graph, then its train op run under the
    rewrite: there is no optimizer object to wrap, so the line says to build the model and
    optimizer in the program and restore the checkpoint, not to wrap an optimizer."""
    from tfamp_rewrite.training import devices

    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setattr(devices, "_logged", set())
    saved = tf.Graph()
    with saved.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        loss = tf.reduce_mean(tf.square(tf1.layers.dense(x, 1, name="d")), name="loss")
        tf1.train.AdamOptimizer(1e-3).minimize(loss, name="train_op")
        exported = tf1.train.export_meta_graph()
    resumed = tf.Graph()
    with resumed.as_default():
        tf1.train.import_meta_graph(exported)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=resumed) as session:
            session.run(init)
            session.run(["train_op", "loss:0"], {"x:0": np.ones((8, 4), np.float32)})
    (said,) = [r.getMessage() for r in caplog.records if "without loss scaling" in r.getMessage()]
    assert "imported as it was saved" in said and "Build the model and its optimizer" in said


def test_freeze_graph_from_a_graph_file_names_the_fix_for_the_loss_scales_variables(tmp_path):
    """The TF1 recipe write_graph + freeze_graph(input_graph, input_checkpoint) failed with an
    IndexError in TensorFlow's Saver on the loss scale's resource variables. It now raises
    a one-line error naming input_meta_graph=, which freezes it."""
    from tensorflow.python.tools import freeze_graph

    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 2], name="x")
        out = tf.identity(tf.matmul(x, tf1.get_variable("w", [2, 1])), name="out")
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(out ** 2))
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(train, {x: [[1.0, 2.0]]})
            tf1.train.write_graph(session.graph_def, str(tmp_path), "graph.pbtxt")
            checkpoint = tf1.train.Saver().save(session, str(tmp_path / "model.ckpt"))
    arguments = dict(input_saver="", input_checkpoint=checkpoint,
                     output_node_names="out", restore_op_name="save/restore_all",
                     filename_tensor_name="save/Const:0", output_graph=str(tmp_path / "frozen.pb"),
                     clear_devices=True, initializer_nodes="")
    with tf.Graph().as_default(), pytest.raises(
            ValueError, match="input_meta_graph=.*convert_variables_to_constants") as raised:
        freeze_graph.freeze_graph(str(tmp_path / "graph.pbtxt"), input_binary=False, **arguments)
    assert "'loss_scale/current_loss_scale'" in str(raised.value) and "\n" not in str(raised.value)
    with tf.Graph().as_default():
        freeze_graph.freeze_graph("", input_binary=True, input_meta_graph=checkpoint + ".meta", **arguments)
    assert (tmp_path / "frozen.pb").stat().st_size > 0


@pytest.mark.parametrize("after_outer_step", [False, True], ids=["alone", "after_the_outer_step"])
def test_an_unrolled_inner_step_written_by_hand_is_said_to_train_unscaled(monkeypatch, caplog,
                                                                          after_outer_step):
    """Learned learning rates: ``w.assign(w - exp(log_lr) * tf.gradients(loss, w))`` under a
    control dependency on the outer, loss-scaled step on ``log_lr``.  Waiting on that step's
    flag made the write count as loss-scaled, and its 2e-8 gradients flushed to zero
    unsaid; the value it writes comes from an unscaled tf.gradients all the same."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.ones([2, 4], np.float32))
        w = tf1.get_variable("w", initializer=np.full([4, 3], 1e-3, np.float32))
        log_lr = tf1.get_variable("log_lr", initializer=0.0)
        g = tf.gradients(1e-8 * tf.reduce_sum(tf.matmul(x, w)), w)[0]
        w_new = w - tf.exp(log_lr) * g
        outer = tf1.train.AdamOptimizer(0.01).minimize(
            tf.reduce_sum(tf.square(tf.matmul(x, w_new) - 1.0)), var_list=[log_lr])
        with tf.control_dependencies([outer] if after_outer_step else []):
            advance = tf1.assign(w, tf.stop_gradient(w_new))
        init = tf1.global_variables_initializer()
    warning = unscaled_training_warning(caplog, graph, init, quiet=init, trains=advance)
    assert re.search(r"1 update op\(s\) \(e.g. 'Assign(VariableOp)?', Assign", warning), warning


@pytest.mark.parametrize("stopped_by", ["back_prop=False", "stop_gradient"])
def test_a_samplers_input_gradients_in_a_loop_without_backprop_are_said(monkeypatch, caplog, stopped_by):
    """An energy-based model's Langevin sampler: tf.gradients of the energy with respect to
    the samples, in a TF1 while loop whose result the loss reads.  With the loop's result
    under stop_gradient the call was said; built with back_prop=False, which stops gradients
    as well, the walk went out of the loop into the loss and took the call for training's."""
    from tfamp_rewrite.training import devices

    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setattr(devices, "_logged", set())
    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        tf1.set_random_seed(0)
        w = tf1.get_variable("w", [2, 16])
        v = tf1.get_variable("v", [16, 1])

        def energy(x):
            return tf.squeeze(tf.matmul(tf.nn.elu(tf.matmul(x, w)), v), 1)

        def langevin(i, x):
            (g,) = tf.gradients(tf.reduce_sum(energy(x)), x)
            return i + 1, x - 0.01 * g + 0.1 * tf1.random_normal(tf.shape(x))

        start = tf1.random_uniform([16, 2], -1.0, 1.0)
        _, negatives = tf.while_loop(lambda i, x: i < 3, langevin, [0, start],
                                     back_prop=stopped_by == "stop_gradient")
        if stopped_by == "stop_gradient":
            negatives = tf.stop_gradient(negatives)
        positives = tf1.placeholder(tf.float32, [16, 2], name="positives")
        loss = tf.reduce_mean(energy(positives)) - tf.reduce_mean(energy(negatives))
        train = tf1.train.GradientDescentOptimizer(1e-3).minimize(loss)
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with tfamp_rewrite.Session(graph=graph) as session:
            session.run(init)
            session.run(train, {positives: np.ones([16, 2], np.float32)})
    (said,) = [r.getMessage() for r in caplog.records if "uses them as values" in r.getMessage()]
    assert "('while/gradients')" in said


def test_a_projection_run_after_a_loss_scaled_step_is_not_said_to_train_unscaled(monkeypatch, caplog):
    """Projected gradient descent: x.assign(max(x, 0)) under a control dependency on the
    loss-scaled step computes nothing from gradients, yet the run was said to train in
    float16 without loss scaling."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    activation.enable_loss_scaling()
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(np.random.RandomState(0).rand(64, 32).astype(np.float32))
        x = tf1.get_variable("x", [32, 1], initializer=tf1.zeros_initializer())
        loss = tf.reduce_sum(tf.square(tf.matmul(a, x) - 1.0))
        step = tf1.train.GradientDescentOptimizer(1e-3).minimize(loss)
        with tf.control_dependencies([step]):
            project = tf1.assign(x, tf.maximum(x, 0.0))
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            tfamp_rewrite.Session(graph=graph) as session:
        session.run(init)
        session.run(project)
    assert not [r for r in caplog.records if "without loss scaling" in r.getMessage()]

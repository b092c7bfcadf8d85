"""tfamp_rewrite.Session: a drop-in tf.compat.v1.Session running the rewritten graph."""
import collections
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from graph_runner import plain_config
from loss_scaling_problems import build
from tensorflow.core.protobuf import config_pb2

from tfamp_rewrite import LossScaleOptimizer
from tfamp_rewrite.training.devices import log_once
from tfamp_rewrite.training.session import InteractiveSession, Session, config_without_tf_amp
from tfamp_rewrite.training.skip_guard import RECOVERED_AFTER
from tfamp_rewrite.training.step_signals import step_signals

tf1 = tf.compat.v1
BIG = 2.0 ** 10  # [1,4] x [4,1] of 2**10 overflows float16 only


@pytest.fixture
def cpu_target(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")


@pytest.fixture(autouse=True)
def summaries_not_said_yet(monkeypatch):
    """Each rewrite summary line, and each said-once line, is logged once per process: these
    tests look for theirs."""
    from tfamp_rewrite.training import devices, shadow_graph

    monkeypatch.setattr(shadow_graph, "_SAID_SUMMARIES", set())
    monkeypatch.setattr(devices, "_logged", set())


def probe_graph():
    """``mm = x @ w`` (inf in float16), ``relu(mm)``, a variable and its initializer."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [1, 4], name="x")
        w = tf.constant(np.full([4, 1], BIG, np.float32), name="w")
        tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
        tf1.get_variable("v", [1], initializer=tf1.ones_initializer())
        tf1.global_variables_initializer()
    return graph


FEED = {"x:0": np.full([1, 4], BIG, np.float32)}


def test_half_kernels_run_inside_the_session(cpu_target):
    graph = probe_graph()
    with Session(graph=graph) as session:
        value = session.run("relu:0", FEED)
    assert value.dtype == np.float32 and np.isinf(value).all()
    with tf1.Session(graph=graph) as plain:
        assert np.isfinite(plain.run("relu:0", FEED)).all()


def test_emulated_numerics_from_the_environment(cpu_target, monkeypatch):
    """TFAMP_REWRITE_NUMERICS=emulate: float32 kernels, yet fp16's overflow and rounding show,
    in fetched outputs of emulated nodes too, and in nodes the user adds later."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph = probe_graph()
    with graph.as_default():
        third = tf.constant(np.full([1, 4], 1.0 / 3, np.float32), name="third")
        thirds = tf.matmul(third, tf.constant(np.eye(4, 1, dtype=np.float32)), name="thirds")
    with Session(graph=graph) as session:
        relu, mm, value = session.run(["relu:0", "mm:0", thirds], FEED)
        (report,) = session.rewrite_reports
        with graph.as_default():
            doubled = tf.matmul(thirds, tf.constant([[2.0]]), name="doubled")
        later = session.run(doubled, FEED)
    assert np.isinf(relu).all() and np.isinf(mm).all()   # the MatMul's own output, rounded to half
    assert value[0, 0] == np.float32(np.float16(1.0 / 3)) != np.float32(1.0 / 3)
    assert later[0, 0] == np.float32(np.float16(2 * np.float16(1.0 / 3)))
    assert report.numerics == "emulate" and report.emulation.nodes == report.nodes_converted
    assert not [op for op in session._shadow.graph.get_operations()
                if op.type == "MatMul" and op.get_attr("T") != tf.float32]


def test_bad_numerics_setting_names_the_choices(cpu_target, monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "fast")
    with pytest.raises(ValueError, match="TFAMP_REWRITE_NUMERICS='fast'.*native.*emulate"):
        Session(graph=probe_graph())


def test_a_session_refused_by_its_arguments_is_collected_quietly(cpu_target, monkeypatch):
    """TensorFlow's __del__ runs on the half-made session: it must find what it reads."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "fast")
    session = Session.__new__(Session)
    with pytest.raises(ValueError, match="TFAMP_REWRITE_NUMERICS"):
        session.__init__(graph=probe_graph())
    session.__del__()


def test_user_graph_is_never_changed(cpu_target):
    graph = probe_graph()
    before = graph.as_graph_def().SerializeToString(deterministic=True)
    with Session(graph=graph) as session:
        session.run(["init", "relu:0"], FEED)
        assert session.graph is graph
    assert graph.as_graph_def().SerializeToString(deterministic=True) == before


Pair = collections.namedtuple("Pair", "first second")


def test_fetch_structures_names_and_ops(cpu_target):
    graph = probe_graph()
    relu, mm = graph.get_tensor_by_name("relu:0"), graph.get_tensor_by_name("mm:0")
    with Session(graph=graph) as session:
        out = session.run({"list": [relu, "mm:0"], "pair": Pair(mm, graph.get_operation_by_name("init")),
                           "name": "init"}, {graph.get_tensor_by_name("x:0"): FEED["x:0"]})
    assert out["pair"].second is None and out["name"] is None
    assert all(np.isinf(v).all() and v.dtype == np.float32 for v in out["list"] + [out["pair"].first])


def test_repeated_runs_keep_their_fetch_structures_and_feed_values(cpu_target):
    """A run repeating the same fetches and feed keys is mapped once (the per-run overhead):
    a tuple and a list of the same tensors still come back as a tuple and a list, each run
    takes its own fed values, and nested feed keys still pair with nested values."""
    graph = probe_graph()
    with graph.as_default():
        x = graph.get_tensor_by_name("x:0")
        y = tf1.placeholder(tf.float32, [1, 4], name="y")
        total = tf.reduce_sum(x + y, name="total")
    with Session(graph=graph) as session:
        for scale in (1.0, 2.0):
            feed = {x: np.full([1, 4], scale, np.float32), "y:0": np.ones([1, 4], np.float32)}
            as_tuple, as_list = session.run((total, "total:0"), feed), session.run([total, "total:0"], feed)
            assert isinstance(as_tuple, tuple) and isinstance(as_list, list)
            assert as_tuple[0] == as_list[1] == 4 * (scale + 1)
        for scale in (1.0, 3.0):
            pair = (np.full([1, 4], scale, np.float32), np.ones([1, 4], np.float32))
            nested = session.run(total, {(x, y): pair})
            assert nested == 4 * (scale + 1)


def test_fetch_dicts_keyed_by_arbitrary_objects(cpu_target):
    """MonitoredSession keys its fetches by hook objects, which cannot be sorted."""
    graph = probe_graph()
    hook, other = object(), object()
    with Session(graph=graph) as session:
        out = session.run({hook: "relu:0", other: ["mm:0"], "caller": graph.get_operation_by_name("init")},
                          FEED)
    assert np.isinf(out[hook]).all() and np.isinf(out[other][0]).all() and out["caller"] is None


def test_sparse_and_indexed_slices(cpu_target):
    graph = tf.Graph()
    with graph.as_default():
        sparse = tf1.sparse_placeholder(tf.float32, name="sp")
        dense = tf.sparse.to_dense(sparse)
        w = tf.constant(np.full([2, 1], BIG, np.float32))
        product = tf.matmul(dense, w, name="product")
        fetched = tf.SparseTensor(sparse.indices, sparse.values * 2.0, sparse.dense_shape)
        slices = tf.IndexedSlices(product, tf.constant([0, 1], tf.int64))
    value = tf1.SparseTensorValue([[0, 0], [1, 1]], np.array([BIG, 1.0], np.float32), [2, 2])
    with Session(graph=graph) as session:
        sparse_out, product_out, slices_out = session.run([fetched, product, slices], {sparse: value})
    np.testing.assert_array_equal(sparse_out.values, [2 * BIG, 2.0])
    assert np.isinf(product_out[0, 0])  # BIG * BIG in half
    assert np.isinf(slices_out.values[0, 0]) and list(slices_out.indices) == [0, 1]


def test_eval_run_default_session_and_interactive(cpu_target):
    graph = probe_graph()
    relu = graph.get_tensor_by_name("relu:0")
    with Session(graph=graph) as session:
        session.run("init")
        assert np.isinf(relu.eval(FEED)).all()  # Tensor.eval through the default session
        graph.get_operation_by_name("init").run()
        assert tf1.get_default_session() is session
    interactive = InteractiveSession(graph=graph)
    try:
        assert np.isinf(relu.eval(FEED)).all()
        assert tf1.get_default_graph() is graph   # TensorFlow's: a graph passed is the default
    finally:
        interactive.close()


def test_an_interactive_session_leaves_the_default_graph_the_users(cpu_target):
    """The notebook pattern: ``sess = tf.InteractiveSession()``, then build and ``.run()``;
    what is built after the session belongs to the user's graph, not the private one."""
    graph = probe_graph()
    with graph.as_default():
        interactive = InteractiveSession()
        try:
            assert tf1.get_default_graph() is graph
            v = tf1.get_variable("built_after", initializer=[2.0])
            tf1.global_variables_initializer().run()
            assert v.graph is graph and v.eval() == [2.0]
            assert np.isinf(graph.get_tensor_by_name("relu:0").eval(FEED)).all()
        finally:
            interactive.close()
        assert tf1.get_default_graph() is graph


def test_running_an_empty_graph_fails_as_tensorflow_says(cpu_target):
    for session_class in (tf1.Session, Session):
        with session_class(graph=tf.Graph()) as session:
            with pytest.raises(RuntimeError, match="The Session graph is empty"):
                session.run("nothing")


def test_fetching_none_fails_with_tensorflows_own_words(cpu_target):
    """``sess.run(ema.average(t))`` where the average is None: a common TF1 mistake."""
    said = []
    for session_class in (tf1.Session, Session):
        with session_class(graph=probe_graph()) as session:
            with pytest.raises(TypeError) as raised:
                session.run(None)
            said.append(str(raised.value))
    assert said[0] == said[1], said


def test_make_callable_partial_run_list_devices(cpu_target):
    graph = probe_graph()
    x, relu = graph.get_tensor_by_name("x:0"), graph.get_tensor_by_name("relu:0")
    with Session(graph=graph) as session:
        with_feeds = session.make_callable([relu], feed_list=[x])
        assert np.isinf(with_feeds(FEED["x:0"])[0]).all()
        read = graph.as_graph_element(graph.get_collection("variables")[0])  # ReadVariableOp or v/read
        without_feeds = session.make_callable([read.name])
        session.run("init")
        assert without_feeds()[0] == 1.0
        handle = session.partial_run_setup([relu], [x])
        assert np.isinf(session.partial_run(handle, relu, {x: FEED["x:0"]})).all()
        assert any("CPU" in device.name for device in session.list_devices())


def test_nodes_added_after_the_first_run_are_rewritten(cpu_target):
    graph = probe_graph()
    with Session(graph=graph) as session:
        session.run("init")
        with graph.as_default():
            later = tf.identity(tf.matmul(graph.get_tensor_by_name("relu:0"),
                                          tf.ones([1, 1]), name="later_mm"), name="later")
            also_float = tf.reduce_sum(graph.get_tensor_by_name("mm:0"), name="sum")  # deny op
        out_later, out_sum = session.run([later, also_float], FEED)
    assert np.isinf(out_later).all() and out_later.dtype == np.float32
    assert out_sum.dtype == np.float32
    assert len(session.rewrite_reports) == 2


def test_a_session_holds_no_copy_of_the_user_graphs_graph_def(cpu_target):
    """A dataset held as a constant (from_tensor_slices of a numpy array) is hundreds of MB:
    the session kept the user GraphDef and its rewrite for its whole life, each constant
    twice more than float32 holds it (6.7 GB peak against 4.3 GB for a 156 MB array)."""
    import gc

    from tensorflow.core.framework import graph_pb2

    graph = probe_graph()
    with graph.as_default():
        tf.constant(np.zeros([256, 256], np.float32), name="dataset_held_as_a_constant")

    def of_this_graph(graph_def):
        return any(node.name == "dataset_held_as_a_constant" for node in graph_def.node)

    with Session(graph=graph) as session:
        session.run("init")
        session.run("relu:0", FEED)
        gc.collect()
        held = [o for o in gc.get_objects() if isinstance(o, graph_pb2.GraphDef) and of_this_graph(o)]
    assert not held


def test_a_saver_built_after_the_first_run_saves_and_restores(cpu_target, tmp_path):
    """The TF1 tutorials' order: train, then ``saver = tf.train.Saver(); saver.save(...)``.
    The Saver's ops are colocated with variables imported earlier (``loc:@w`` on a reference
    variable's Assign); the session keeps those constraints on its copies."""
    graph, _, reads, feeds = training_graph()
    with Session(graph=graph) as session:
        session.run("init")
        session.run("train_op", feeds)
        with graph.as_default():
            kernel = graph.get_tensor_by_name("hidden/kernel:0")
            with graph.colocate_with(kernel.op):
                tf.identity(kernel, name="late_colocated")
            late_saver = tf1.train.Saver(name="late_saver")
        path = late_saver.save(session, str(tmp_path / "late"))
        trained = session.run(reads)
        session.run("train_op", feeds)
        late_saver.restore(session, path)
        np.testing.assert_equal(session.run(reads), trained)
        private = session._shadow.graph.get_operation_by_name("late_colocated")
        assert private.colocation_groups() == [b"loc:@hidden/kernel"]


def test_nodes_added_later_keep_their_control_inputs_on_earlier_ones(cpu_target):
    """``sess.run(tf.global_variables_initializer())`` built after a first run (its NoOp's
    control inputs are the initializers imported then), and a read after a train step."""
    graph, _, reads, feeds = training_graph()
    with Session(graph=graph) as session:
        session.run("init")
        initial = session.run(reads)
        session.run("train_op", feeds)
        with graph.as_default():
            initialize_again = tf1.global_variables_initializer()
            zero = tf.zeros([])
            with tf.control_dependencies([graph.get_operation_by_name("train_op")]):
                after_a_step = tf.identity(zero, name="after_a_step")
        zero_initialized = [read for read, value in zip(reads, initial) if not value.any()]
        assert len(zero_initialized) == 6 and any(session.run(zero_initialized)[0])  # biases, slots
        session.run(initialize_again)
        assert not any(value.any() for value in session.run(zero_initialized))
        session.run(after_a_step, feeds)
        assert not np.array_equal(session.run(reads[0]), initial[0])  # the step ran first
        private = session._shadow.graph.get_operation_by_name("after_a_step")
        assert [op.name for op in private.control_inputs] == ["train_op"]


def callable_options(feeds=(), fetches=(), targets=()):
    options = config_pb2.CallableOptions()
    options.feed.extend(feeds)
    options.fetch.extend(fetches)
    options.target.extend(targets)
    return options


def test_callables_made_from_options_run_the_rewrite_and_watch_its_steps(cpu_target):
    """``_make_callable_from_options`` is how tf.keras runs in TF1 graph mode (fit, predict):
    the options name the user graph's tensors and ops, made after the first run too."""
    graph = probe_graph()
    with Session(graph=graph) as session:
        session.run("init")
        with graph.as_default():
            tf.identity(graph.get_tensor_by_name("mm:0"), name="built_later")
        run = session._make_callable_from_options(callable_options(["x:0"], ["relu:0", "built_later:0"]))
        relu, later = run(FEED["x:0"])
    assert relu.dtype == later.dtype == np.float32 and np.isinf(relu).all() and np.isinf(later).all()

    problem = build(lambda: LossScaleOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9)))
    with Session(graph=problem.graph) as session:
        with problem.graph.as_default():
            session.run(tf1.global_variables_initializer())
        step = session._make_callable_from_options(callable_options(
            [problem.overflow.name], targets=[problem.train_op.name]))
        assert step(np.float32(np.inf)) == [] and step(np.float32(np.nan)) == []
        (signal,) = step_signals(problem.graph)
        assert session._watch._guard(signal).episode.skipped == 2
        for _ in range(RECOVERED_AFTER):  # applied in a row: the episode ends
            step(np.float32(1.0))
        assert session._watch._guard(signal).episode is None


def test_without_a_gpu_runs_unchanged_and_says_why(monkeypatch, caplog):
    monkeypatch.delenv("TFAMP_REWRITE_TARGET", raising=False)
    graph = probe_graph()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with Session(graph=graph) as session:
            value = session.run("relu:0", FEED)
        assert np.isfinite(value).all()
        Session(graph=graph).close()
    messages = [r.message for r in caplog.records if "compute capability" in r.message]
    assert len(messages) <= 1  # once per process
    log_once("x")  # the same message is not logged twice
    assert sum("TFAMP_REWRITE_TARGET=cpu" in m for m in messages) == len(messages)


def test_tensorflows_own_amp_is_switched_off(monkeypatch):
    """A user config turning on TensorFlow's CPU AMP must not rewrite behind our back."""
    monkeypatch.delenv("TFAMP_REWRITE_TARGET", raising=False)
    config = tf1.ConfigProto()
    config.graph_options.rewrite_options.auto_mixed_precision_cpu = 1  # ON
    config.graph_options.rewrite_options.min_graph_nodes = -1
    with tf1.Session(graph=probe_graph(), config=config) as plain:
        assert np.isinf(plain.run("relu:0", FEED)).all()  # TensorFlow's pass did rewrite
    with Session(graph=probe_graph(), config=config) as session:
        assert np.isfinite(session.run("relu:0", FEED)).all()
    assert config_without_tf_amp(config).graph_options.rewrite_options.auto_mixed_precision_cpu == 2


def test_a_config_switching_tensorflows_amp_off_keeps_that_session_float32(cpu_target, monkeypatch,
                                                                            caplog):
    """NVIDIA's variables and TensorFlow's enable_mixed_precision_graph_rewrite leave a session
    whose config says auto_mixed_precision OFF unconverted; so does this one, and says so."""
    monkeypatch.setattr("tfamp_rewrite.training.devices._logged", set())
    off = tf1.ConfigProto()
    off.graph_options.rewrite_options.auto_mixed_precision = 2  # OFF
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        for _ in range(2):
            with Session(graph=probe_graph(), config=off) as session:
                assert np.isfinite(session.run("relu:0", FEED)).all()  # float32: no overflow
    said = [r.getMessage() for r in caplog.records if "auto_mixed_precision to OFF" in r.getMessage()]
    assert len(said) == 1
    on = tf1.ConfigProto()
    on.graph_options.rewrite_options.auto_mixed_precision = 1  # ON: ours rewrites, TensorFlow's does not
    with Session(graph=probe_graph(), config=on) as session:
        assert np.isinf(session.run("relu:0", FEED)).all()


def test_an_inference_run_returning_inf_is_said_once(cpu_target, monkeypatch, caplog):
    """No loss-scaled step watches a run that only infers: an inf/nan it returns is said."""
    monkeypatch.setattr("tfamp_rewrite.training.devices._logged", set())
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            Session(graph=probe_graph()) as session:
        assert np.isfinite(session.run("relu:0", {"x:0": np.ones([1, 4], np.float32)})).all()
        assert not [r for r in caplog.records if "returned inf/nan" in r.getMessage()]
        for _ in range(2):
            assert np.isinf(session.run({"out": ["relu:0"]}, FEED)["out"][0]).all()
        healed = session.heals  # the second run found the node; later runs keep it float32
    (line,) = [r.getMessage() for r in caplog.records if "returned inf/nan" in r.getMessage()]
    assert "returned inf/nan in 'relu:0' and computed no loss-scaled step" in line
    assert healed and healed[0].trajectory == "an inference run's inf/nan, traced to its node"
    monkeypatch.setattr("tfamp_rewrite.training.devices._logged", set())
    monkeypatch.setattr("tfamp_rewrite.training.heal_memory._healed_in_process", {})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            Session(graph=probe_graph()) as session:  # Keras' way: a callable from options
        predict = session._make_callable_from_options(
            config_pb2.CallableOptions(feed=["x:0"], fetch=["relu:0"]))
        assert np.isinf(predict(FEED["x:0"])[0]).all()
    assert [r for r in caplog.records if "returned inf/nan in 'relu:0'" in r.getMessage()]


def test_an_inference_run_returning_inf_with_healing_off_says_the_edit_not_a_heal(cpu_target, monkeypatch,
                                                                                   caplog):
    """With healing off the first line promises no heal: it says the list edit is named."""
    monkeypatch.setattr("tfamp_rewrite.training.devices._logged", set())
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), \
            Session(graph=probe_graph(), auto_fix=False) as session:
        for _ in range(3):
            assert np.isinf(session.run("relu:0", FEED)).all()
        assert not session.heals
    (line,) = [r.getMessage() for r in caplog.records if "returned inf/nan" in r.getMessage()]
    assert "keeps it float32 if" not in line
    assert "say the list edit that keeps it float32 (healing is off: TFAMP_REWRITE_AUTO_FIX=0)" in line
    (found,) = [r.getMessage() for r in caplog.records if "found where the inf/nan starts" in r.getMessage()]
    assert "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_" in found and "TFAMP_REWRITE_NODES_TO_EXCLUDE=" in found


def test_a_session_closed_while_its_search_is_on_says_so_once(cpu_target, monkeypatch, caplog):
    """An Estimator's evaluation session may end before the search's runs: said once per
    process, with how many of its runs looked."""
    monkeypatch.setattr("tfamp_rewrite.training.devices._logged", set())
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        for _ in range(2):
            with Session(graph=probe_graph()) as session:
                assert np.isinf(session.run("relu:0", FEED)).all()  # said: the search starts
    (line,) = [r.getMessage() for r in caplog.records if "a session closed while looking" in r.getMessage()]
    assert "no later run computed that node and ran to its end" in line
    caplog.clear()
    monkeypatch.setattr("tfamp_rewrite.training.devices._logged", set())
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=probe_graph()) as session:
        for _ in range(3):  # said, then the second run finds the node: nothing is pending at close
            session.run("relu:0", FEED)
    assert "found where the inf/nan starts" in caplog.text and "a session closed while" not in caplog.text


def test_training_runs_that_never_compute_what_an_inference_run_returned_do_not_search_for_it(
        cpu_target, monkeypatch, caplog):
    """A feature extractor fetched once returns inf; the training steps after it compute
    another loss, and their skipped steps' gradient overflows are the loss scale's.  They
    neither end the search ("found none") nor are taken for its origin; the next run that
    computes the features finds and heals the MatMul that overflowed."""
    monkeypatch.setattr("tfamp_rewrite.training.devices._logged", set())
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        big = tf1.get_variable("big", [8, 8], initializer=tf1.constant_initializer(3000.0), trainable=False)
        features = tf.matmul(x, big, name="features")  # 72000 in float32: inf in float16
        w = tf1.get_variable("w", [8, 1])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w, name="prediction") - 1.0))
        train = LossScaleOptimizer(tf1.train.AdamOptimizer(0.01), "dynamic").minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: np.full((4, 8), 3.0, np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        assert np.isinf(session.run(features, feed)).all()
        for _ in range(12):  # more than the search's runs; the first steps skip at 32768
            session.run([train, loss], feed)
        assert session.heals == []
        session.run(features, feed)  # computes the features: the search finds their node
        healed = session.heals
        assert np.isfinite(session.run(features, feed)).all()
    assert [h.nodes for h in healed] == [["features"]]
    said = caplog.text
    assert "found none" not in said and "gradients/" not in said.split("found where")[-1].split("\n")[0]


def training_graph():
    """Dense layers trained with Momentum (variables + slots), and a Saver over all of them."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [8, 16], name="x")
        y = tf1.placeholder(tf.int32, [8], name="y")
        hidden = tf1.layers.dense(x, 32, tf.nn.relu, name="hidden")
        logits = tf1.layers.dense(hidden, 4, name="logits")
        loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
        tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
        saver = tf1.train.Saver()
        reads = [v.value() for v in tf1.global_variables()]
    rng = np.random.default_rng(0)
    feeds = {"x:0": rng.standard_normal((8, 16)).astype(np.float32), "y:0": rng.integers(0, 4, 8)}
    return graph, saver, reads, feeds


def test_checkpoints_move_between_amp_and_float32(cpu_target, tmp_path):
    graph, saver, reads, feeds = training_graph()
    assert len(reads) == 8  # 2 kernels, 2 biases, their 4 Momentum slots
    with Session(graph=graph) as amp:
        amp.run("init")
        for _ in range(3):
            amp.run("train_op", feeds)
        trained = amp.run(reads)
        path = saver.save(amp, str(tmp_path / "amp"))
    with tf1.Session(graph=graph, config=plain_config()) as fp32:
        saver.restore(fp32, path)
        restored = fp32.run(reads)
        fp32.run("train_op", feeds)
        path2 = saver.save(fp32, str(tmp_path / "fp32"))
        after_fp32_step = fp32.run(reads)
    for a, b in zip(trained, restored):
        np.testing.assert_array_equal(a, b)
    with Session(graph=graph) as amp_again:
        saver.restore(amp_again, path2)
        for a, b in zip(after_fp32_step, amp_again.run(reads)):
            np.testing.assert_array_equal(a, b)


def _reciprocal_graph():
    """The VAE reconstruction gradient of test_compat.py: its Reciprocal is half only where
    infer-after-allow applies (compat "latest")."""
    from compat_graphs import vae_reconstruction_graph

    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(vae_reconstruction_graph(), name="")
    return graph


def _reciprocal_dtype(session) -> str:
    session.run("grad:0", {"x:0": np.ones([2, 8], np.float32)})
    (report,) = session.rewrite_reports
    return report.decision("reciprocal").dtype


def test_sessions_follow_the_running_tensorflows_pass_and_say_so(cpu_target, monkeypatch, caplog):
    from tfamp_rewrite.graph_rewrite.compat import compat_of_tensorflow

    monkeypatch.delenv("TFAMP_REWRITE_COMPAT", raising=False)
    running = compat_of_tensorflow(tf.__version__)
    graph = _reciprocal_graph()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with Session(graph=graph) as session:
            dtype = _reciprocal_dtype(session)
    assert session.rewrite_reports[0].compat == running
    assert dtype == ("float16" if running == "latest" else "float32")
    (line,) = [r.getMessage() for r in caplog.records if "session graph rewritten" in r.getMessage()]
    assert "compat=%s target=cpu numerics=native" % running in line
    assert "converted %d of " % session.rewrite_reports[0].nodes_converted in line


def test_the_same_rewrite_in_a_new_session_is_not_said_again(cpu_target, caplog):
    """An Estimator opens a session on a graph like the last for every evaluation."""
    with caplog.at_level(logging.DEBUG, logger="tfamp_rewrite"):
        for _ in range(3):
            graph = _reciprocal_graph()
            with Session(graph=graph) as session:
                _reciprocal_dtype(session)
    levels = [r.levelno for r in caplog.records if "session graph rewritten" in r.getMessage()]
    assert levels == [logging.INFO, logging.DEBUG, logging.DEBUG]


def test_a_misspelled_list_variable_is_said_once_as_a_warning(cpu_target, monkeypatch, caplog):
    monkeypatch.setattr("tfamp_rewrite.training.devices._logged", set())
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD", "Reciprocall")
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        for _ in range(2):
            with Session(graph=_reciprocal_graph()) as session:
                _reciprocal_dtype(session)
    said = [r.getMessage() for r in caplog.records if "Reciprocall" in r.getMessage()]
    assert len(said) == 1 and "did you mean Reciprocal or" in said[0], said


def test_a_growing_graph_says_its_first_rewrite_and_first_growth_only(cpu_target, caplog):
    """Keras grows the graph at every fit, evaluate and predict, an evaluation loop at every
    Session it opens: one line each would be noise."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        outputs = [tf.matmul(x, tf.ones([4, 4]))]
    feed = {x: np.ones([2, 4], np.float32)}
    with caplog.at_level(logging.DEBUG, logger="tfamp_rewrite"):
        with Session(graph=graph) as session:
            for _ in range(4):
                session.run(outputs[-1], feed)
                with graph.as_default():
                    outputs.append(tf.matmul(outputs[-1], tf.ones([4, 4])))
        for _ in range(2):  # an evaluation loop: a Session per evaluation, each growing the graph
            with Session(graph=graph) as evaluation:
                evaluation.run(outputs[-1], feed)
                with graph.as_default():
                    outputs.append(tf.matmul(outputs[-1], tf.ones([4, 4])))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "session graph" in r.getMessage()]
    assert [level for level, _ in lines] == [logging.INFO, logging.INFO] + [logging.DEBUG] * 4
    assert "rewritten: converted" in lines[0][1]
    assert "grew, rewritten again (later growth is rewritten without a line each)" in lines[1][1]
    assert len(session.rewrite_reports) == 4


def test_a_graph_grown_inside_the_training_loop_is_said_and_keeps_few_reports(cpu_target, caplog):
    """A TF1 program building an op in its loop (tf.reduce_mean of a fetched value) grows
    the graph at every run, and each growth rewrites the whole graph: said once, at the
    20th growth, naming the newest op; the session keeps the first and latest reports only
    (a report per growth would grow memory at every step)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        out = tf.matmul(x, tf.ones([4, 4]))
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), Session(graph=graph) as session:
        for step in range(30):
            session.run(out, {x: np.ones([2, 4], np.float32)})
            with graph.as_default():
                tf.reduce_mean(out, name="mean_%d" % step)
        reports = session.rewrite_reports
    said = [r.getMessage() for r in caplog.records if "has grown" in r.getMessage()]
    assert len(said) == 1 and "grown 20 times (lately by 'mean_19" in said[0]
    assert "build them once, before the loop" in said[0]
    assert "to rewrite and import it, before TensorFlow extends the session with it" in said[0]
    assert len(reports) == 16 and "mean_0" not in [d.name for d in reports[0].decisions]
    assert "mean_28" in [d.name for d in reports[-1].decisions]


def test_a_value_built_inside_the_wrapped_apply_is_said_before_tensorflow_refuses_it(cpu_target, caplog):
    """LAMB and LARS code fetches the trust ratio its _apply_dense builds; a loss-scaled
    step runs the apply inside a tf.cond, where TensorFlow cannot fetch it: said first."""
    class LoggingOptimizer(tf1.train.GradientDescentOptimizer):
        def _apply_dense(self, grad, var):  # reference variables (TF1)
            self.ratio = tf.norm(var) / tf.norm(grad)
            return super()._apply_dense(grad, var)

        def _resource_apply_dense(self, grad, handle):
            self.ratio = tf.norm(grad)
            return super()._resource_apply_dense(grad, handle)

    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=np.ones([4, 1], np.float32))
        optimizer = LoggingOptimizer(0.1)
        train_op = LossScaleOptimizer(optimizer, "dynamic").minimize(tf.reduce_sum(tf.square(w)))
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        with pytest.raises((ValueError, tf.errors.OpError)):
            session.run([train_op, optimizer.ratio])
    said = [r.getMessage() for r in caplog.records if "built inside the optimizer's apply" in r.getMessage()]
    if tf1.control_flow_v2_enabled():  # cond_v2: the value belongs to a branch function's graph,
        assert said == []               # which TensorFlow's own error names
    else:
        assert len(said) == 1 and repr(optimizer.ratio.name) in said[0]


def test_a_second_session_on_a_graph_that_did_not_grow_says_nothing_of_growth(cpu_target, caplog):
    """Train in one Session, then restore and evaluate in another on the same graph: the
    graph did not grow, and no line says it did."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        out = tf.matmul(x, tf.ones([4, 4]))
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        for _ in range(2):
            with Session(graph=graph) as session:
                session.run(out, {x: np.ones([2, 4], np.float32)})
    lines = [r.getMessage() for r in caplog.records if "session graph" in r.getMessage()]
    assert len(lines) == 1 and "session graph rewritten: converted" in lines[0]


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_session_compat_argument_and_environment_override_the_default(cpu_target, monkeypatch, how):
    graph = _reciprocal_graph()
    if how == "environment":
        monkeypatch.setenv("TFAMP_REWRITE_COMPAT", "latest")
        session = Session(graph=graph)
    else:
        monkeypatch.setenv("TFAMP_REWRITE_COMPAT", "tf1.15")  # the argument wins
        session = Session(graph=graph, compat="latest")
    with session:
        assert _reciprocal_dtype(session) == "float16"
    assert session.rewrite_reports[0].compat == "latest"
    monkeypatch.setenv("TFAMP_REWRITE_COMPAT", "tf3")
    with pytest.raises(ValueError, match="TFAMP_REWRITE_COMPAT='tf3' is not a compat"):
        Session(graph=graph)


@pytest.mark.own_processes("a TF1 program in a new process")
@pytest.mark.parametrize("level,shown", [("0", True), ("1", False)])
def test_the_summary_line_reaches_an_unconfigured_program_unless_quieted(tmp_path, level, shown):
    """A TF1 program that configures no logging sees the line on stderr, as it sees
    TensorFlow's own C++ INFO lines; TF_CPP_MIN_LOG_LEVEL=1 hides both."""
    import subprocess
    import sys

    script = tmp_path / "program.py"
    script.write_text(
        "import numpy as np, tensorflow as tf\n"
        "import tfamp_rewrite\n"
        "tf.compat.v1.disable_v2_behavior()\n"
        "x = tf.compat.v1.placeholder(tf.float32, [1, 4], name='x')\n"
        "y = tf.matmul(x, tf.ones([4, 1]))\n"
        "with tfamp_rewrite.Session(graph=x.graph) as sess:\n"
        "    sess.run(y, {x: np.ones([1, 4], np.float32)})\n")
    env = dict(os.environ, TFAMP_REWRITE_TARGET="cpu", TF_CPP_MIN_LOG_LEVEL=level)
    completed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                               env=env, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = [line for line in completed.stderr.splitlines()
             if line.startswith("tfamp_rewrite: session graph rewritten: converted 1 of")]
    assert len(lines) == (1 if shown else 0), completed.stderr[-2000:]


@pytest.mark.parametrize("numerics", ["native", "emulate"])
def test_feeding_a_tensor_the_rewrite_made_half_says_its_values_round(cpu_target, caplog, numerics):
    """An RNN's zero state (a Fill between MatMuls, so half) fed back: values round, once said."""
    graph = tf.Graph()
    with graph.as_default():
        state = tf.fill([1, 4], 0.0, name="zero_state_" + numerics)  # log_once: a name each
        w = tf.constant(np.eye(4, dtype=np.float32))
        out = tf.matmul(tf.matmul(state, w, name="first"), w, name="second")
    fed = np.array([[1.0 + 2.0 ** -11, 3.0, 1e-3, 0.1]], np.float32)
    as_half = fed.astype(np.float16).astype(np.float32)  # 1 + 2**-11 -> 1; 1e-3 and 0.1 round
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with Session(graph=graph, numerics=numerics) as session:
            values = [session.run(out, {state: fed}) for _ in range(2)]
    assert np.array_equal(values[0], as_half) and np.array_equal(values[1], as_half)
    said = [r.getMessage() for r in caplog.records if state.name + " is fed" in r.getMessage()]
    assert said and "rounded to float16" in said[0]


def test_feeding_values_past_the_half_range_says_what_to_keep_float32(cpu_target, caplog, monkeypatch):
    """Eval code feeding an in-graph cast of raw counts directly: 70000 held in half is inf,
    the run returned nan, and nothing said the fed values were past the range. The line
    names the setting, which gives float32's values."""
    from tfamp_rewrite.training import devices

    monkeypatch.setattr(devices, "_logged", set())
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")

    def run_once():
        graph = tf.Graph()
        with graph.as_default():
            raw = tf1.placeholder(tf.int64, [None, 3], name="raw")
            x = tf.cast(raw, tf.float32, name="x")
            out = tf.matmul(x, tf.constant(np.eye(3, dtype=np.float32)), name="out")
        with Session(graph=graph) as session:
            return session.run(out, {x: [[1.0, 2049.0, 70000.0]]})

    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        assert not np.isfinite(run_once()).all()
    (said,) = [r.getMessage() for r in caplog.records if "past float16's range" in r.getMessage()]
    setting = said.split("TFAMP_REWRITE_NODES_TO_EXCLUDE='")[1].split("'")[0]
    assert setting == "^x$,^out$"
    monkeypatch.setenv("TFAMP_REWRITE_NODES_TO_EXCLUDE", setting)
    np.testing.assert_array_equal(run_once(), [[1.0, 2049.0, 70000.0]])


def test_several_fed_tensors_that_round_are_said_in_one_line(cpu_target, caplog):
    """An LSTM's state fed back is a tuple of tensors (c and h per layer): one line for all."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.constant(np.eye(4, dtype=np.float32))
        states = [tf.fill([1, 4], 0.0, name="lstm_state_%d" % i) for i in range(3)]
        out = tf.add_n([tf.matmul(tf.matmul(s, w), w) for s in states])
    with graph.as_default():  # ptb_word_lm's Valid and Test models: the same line again
        other_states = [tf.fill([1, 4], 0.0, name="valid_state_%d" % i) for i in range(3)]
        other_out = tf.add_n([tf.matmul(s, w) for s in other_states])
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with Session(graph=graph) as session:
            for _ in range(2):
                session.run(out, {s: np.ones([1, 4], np.float32) for s in states})
            session.run(other_out, {s: np.ones([1, 4], np.float32) for s in other_states})
    said = [r.getMessage() for r in caplog.records if "rounded to float16" in r.getMessage()]
    assert len(said) == 1 and "3 fed tensors ('lstm_state_0:0'" in said[0], said
    assert "fed back (an RNN's state), are exact already" in said[0]


def test_histogram_summaries_leave_the_non_finite_values_of_skipped_steps_out(cpu_target, caplog):
    """TensorFlow's CIFAR-10 tutorial pattern: a histogram of each gradient, fetched with the
    train op.  A skipped step's gradients are inf; HistogramSummary would fail the run."""
    problem = build(lambda: LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1)))
    with problem.graph.as_default():
        grads = problem.optimizer.compute_gradients(problem.loss)
        for grad, variable in grads:
            tf1.summary.histogram(variable.op.name + "/gradient", grad)
        train = problem.optimizer.apply_gradients(grads)
        merged = tf1.summary.merge_all()
        init = tf1.global_variables_initializer()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with Session(graph=problem.graph) as session:
            session.run(init)
            skipped = tf1.Summary.FromString(session.run([merged, train], {problem.overflow: np.inf})[0])
            applied = tf1.Summary.FromString(session.run([merged, train])[0])
    def counts(summary):
        return {value.tag: value.histo.num for value in summary.value if value.HasField("histo")}

    assert counts(skipped) == {"w/gradient": 0, "b/gradient": 0}   # every value was inf
    assert counts(applied) == {"w/gradient": 3, "b/gradient": 1}
    (said,) = [r.getMessage() for r in caplog.records if "histogram summaries" in r.getMessage()]
    assert "A skipped step's gradient histograms come out empty (count 0)" in said
    assert not [op for op in problem.graph.get_operations() if "tfamp" in op.name]


def test_a_histogram_of_float32s_own_values_fails_the_run_as_in_float32(cpu_target, caplog):
    """A diverging run's classic alarm, "Infinity in Histogram": the filter left every
    histogram's inf out, weights' and float32 activations' too, and the run went on with an
    inf loss.  Only values a half node or a backward pass computes are filtered; once a
    heal keeps a layer float32, its histogram fails as float32's does, naming the user's
    node, not the heal's private copy."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        hidden = tf.matmul(x, tf.ones([4, 4]), name="hidden")
        tf1.summary.histogram("hidden_values", hidden)
        own = tf1.summary.histogram("own_values", tf.exp(x))  # no half node upstream
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        with pytest.raises(tf.errors.InvalidArgumentError, match="Infinity in Histogram for: own_values"):
            session.run(own, {x: np.full([2, 4], 100.0, np.float32)})
        hidden_histogram = graph.get_tensor_by_name("hidden_values:0")
        for _ in range(4):  # 4 * 2e4 past float16: said, found, healed
            session.run([hidden, hidden_histogram], {x: np.full([2, 4], 2e4, np.float32)})
        assert session.heals
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:  # past float32 too
            session.run(hidden_histogram, {x: np.full([2, 4], 1e38, np.float32)})
    assert "Infinity in Histogram for: hidden_values" in raised.value.message
    assert "tfamp_heal_" not in raised.value.message


def test_a_graph_trained_with_loss_scaling_is_freed_once_its_session_and_tensors_are_gone():
    """A sweep builds a graph per trial: each was kept alive by the step signals' registry
    (keyed by graph, weakly, but holding the graph's own tensors), growing memory per trial."""
    import gc
    import weakref

    def trial():
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            w = tf1.get_variable("w", initializer=tf.ones([4, 1]))
            loss = tf.reduce_mean(tf.square(tf.linalg.matmul(x, w)))
            train = LossScaleOptimizer(tf1.train.AdamOptimizer(0.1), "dynamic").minimize(loss)
            init = tf1.global_variables_initializer()
        with Session(graph=graph) as session:
            session.run(init)
            session.run(train, {x: np.ones([2, 4], np.float32)})
        return weakref.ref(graph)

    graphs = [trial() for _ in range(3)]
    gc.collect()
    assert [ref() for ref in graphs] == [None, None, None]


@pytest.mark.tf1_behavior  # TF2 behaviour gives every graph thread-local stacks already
def test_each_thread_building_in_the_private_graph_has_its_own_stacks(monkeypatch):
    """A3C workers and serving pools call Session.run from several threads, and a run may
    build its plans' ops in the session's private graph then: a TF1 graph shares its
    name-scope, colocation and control-dependency stacks between threads, and two threads
    building at once popped each other's ('IndexError: pop from empty list'), or built
    their ops where another thread's colocation put them."""
    import threading

    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        tf.identity(tf.linalg.matmul(x, tf.ones([4, 4])), name="y")
    with Session(graph=graph) as session:
        session.run("y:0", {x: np.ones([1, 4], np.float32)})
        private = session._shadow.graph  # pylint: disable=protected-access
        inside, seen = threading.Event(), {}

        def hold_a_colocation():
            first = private.get_operations()[0]
            with private.as_default():
                with private.colocate_with(first):
                    inside.set()
                    done.wait()

        done = threading.Event()
        holder = threading.Thread(target=hold_a_colocation)
        holder.start()
        inside.wait()
        with private.as_default():
            seen["groups"] = tf.constant(1.0, name="built_beside").op.colocation_groups()
        done.set()
        holder.join()
    assert seen["groups"] == [b"loc:@built_beside"]  # not the other thread's op's


@pytest.mark.parametrize("failing", ["reshaped", "mm"])
def test_an_op_error_names_the_users_op_and_where_the_program_defined_it(cpu_target, failing):
    """The session runs a private graph: TensorFlow's error named the private op, whose
    "Original stack trace" was empty, so the user lost the line that built the failing op
    (a Reshape fed another batch size; a MatMul the rewrite converted, fed another width)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, None, name="x")
        mm = tf.matmul(x, tf.ones([4, 3]), name="mm")
        tf.reshape(mm, [5, -1], name="reshaped")
    feed = {"x:0": np.ones([2, 4] if failing == "reshaped" else [2, 6], np.float32)}
    with pytest.raises(tf.errors.InvalidArgumentError) as plain:
        with tf1.Session(graph=graph) as session:
            session.run("reshaped:0", feed)
    with pytest.raises(tf.errors.InvalidArgumentError) as rewritten:
        with Session(graph=graph) as session:
            session.run("mm:0", {"x:0": np.ones([2, 4], np.float32)})
            assert "mm" in {d.name for d in session.rewrite_reports[0].decisions if d.converted}
            session.run("reshaped:0", feed)
    error = rewritten.value
    assert error.op is graph.get_operation_by_name(failing) is plain.value.op
    assert error.message.count(__file__) == plain.value.message.count(__file__) >= 1


def test_threads_making_their_first_runs_on_a_shared_session_at_once(cpu_target):
    """Hogwild workers, an evaluator and a logger share one session and start together:
    planning one thread's run walked the private graph's consumers while another's added
    ops to it, and TensorFlow failed with 'SystemError: bad argument to internal function'."""
    import threading

    rng = np.random.RandomState(0)
    inputs, labels = rng.randn(64, 20).astype(np.float32), rng.randint(0, 2, 64)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 20])
        y = tf1.placeholder(tf.int64, [None])
        logits = tf1.layers.dense(tf1.layers.dense(x, 32, tf.nn.relu), 2)
        loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        train = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.05)).minimize(loss)
        init = tf1.global_variables_initializer()
        fetch_sets = [train, [train, loss], accuracy, [accuracy, loss], tf.argmax(logits, 1),
                      tf.nn.softmax(logits), [train, accuracy], loss]
    errors = []
    for _ in range(6):
        with Session(graph=graph) as session:
            session.run(init)
            barrier = threading.Barrier(len(fetch_sets))

            def runs(fetches, barrier=barrier):
                barrier.wait()
                try:
                    for _ in range(2):
                        session.run(fetches, {x: inputs, y: labels})
                except Exception as error:  # pylint: disable=broad-except
                    errors.append(repr(error)[:160])

            threads = [threading.Thread(target=runs, args=(f,)) for f in fetch_sets]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    assert errors == []


def test_a_print_a_histogram_summary_reads_prints_once_per_run(cpu_target, capfd):
    """tf.Print of gradient norms beside their histograms: the histogram's finite-values
    filter read the Print through IsFinite, and Grappler then ran the Print twice per run."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=tf.ones([4, 1]))
        # a MatMul's values: the filter reads them (a float32 histogram has none)
        printed = tf1.Print(tf.matmul(tf.ones([2, 4]), w), [tf.norm(w)], message="printed norm: ", first_n=3)
        histogram = tf1.summary.histogram("h", printed)
        step = tf1.assign_add(w, tf.reduce_sum(printed) * 0.0 * w)
        init = tf1.global_variables_initializer()
    with Session(graph=graph) as session:
        session.run(init)
        capfd.readouterr()
        for _ in range(3):
            session.run([step, histogram])
    assert capfd.readouterr().err.count("printed norm: ") == 3


def test_a_print_on_the_loss_prints_only_in_the_runs_fetching_it(cpu_target, capfd):
    """``loss = tf.Print(loss, ...)`` then ``minimize``: float32 prints only in runs that
    fetch the loss.  The step's loss check read the Print, so a run of the train op alone
    printed (twice: Grappler's arithmetic optimizer duplicates a Print read by IsFinite)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        loss = tf.reduce_mean(tf.square(tf1.layers.dense(x, 1)))
        loss = tf1.Print(loss, [loss], message="printed loss: ")
        optimizer = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.01), "dynamic")
        train_op = optimizer.minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: np.ones((8, 4), np.float32)}
    with Session(graph=graph) as session:
        session.run(init)
        capfd.readouterr()
        for _ in range(3):
            session.run(train_op, feed)
        alone = capfd.readouterr().err.count("printed loss: ")
        for _ in range(3):
            session.run([train_op, loss], feed)
        fetched = capfd.readouterr().err.count("printed loss: ")
    assert (alone, fetched) == (0, 3)


def test_fetching_none_raises_tensorflows_error_alone(cpu_target):
    """tf.gradients of a value that does not depend on x is None; fetching it raised
    TensorFlow's TypeError chained to a KeyError of the session's fetch cache."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2], name="x")
        (gradient,) = tf.gradients(tf.constant([1.0, 2.0]) * 2.0, [x])
    with Session(graph=graph) as session:
        with pytest.raises(TypeError, match="Cannot be None") as raised:
            session.run(gradient, {x: [1.0, 2.0]})
    assert raised.value.__context__ is None or not isinstance(raised.value.__context__, KeyError)

"""Where the inf/nan of an inference run starts (non_finite_origin.py, origin_search.py).

The first inference run returning inf/nan is said at once, naming the fetched tensor; the
next runs look for the origin and name the node to keep float32 -- which is not the fetched
one when the overflow happened upstream (a GP's test kernel, read by the predictive mean).
"""
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1

from tfamp_rewrite.training import origin_search
from tfamp_rewrite.training.session import Session

tf1 = tf.compat.v1
ORIGIN = "found where the inf/nan starts"


pytestmark = pytest.mark.usefixtures("cpu_target_and_fresh_log")


def origin_lines(caplog):
    return [r.getMessage() for r in caplog.records if ORIGIN in r.getMessage()
            or "starts outside float16" in r.getMessage() or "does not start in" in r.getMessage()]


def two_layer_graph(first_input="fed"):
    """``out = relu(x @ w1) @ w2``: x of 300 makes the first MatMul 1.2e5, past float16;
    the second reads its inf and returns it.  ``first_input="exp"``: x goes through a float32
    ``Exp`` (deny list) first, so the value past float16 is float32's, cast for the MatMul."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        source = tf.exp(x, name="grow") if first_input == "exp" else x
        hidden = tf.matmul(source, tf.constant(np.full((4, 16), 100.0, np.float32)), name="kernel")
        tf.matmul(tf.nn.relu(hidden), tf.constant(np.full((16, 2), 0.01, np.float32)), name="out")
    return graph


def run_three_times(graph, value, caplog):
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with Session(graph=graph) as session:
            return [session.run("out:0", {"x:0": value}) for _ in range(3)]


@pytest.mark.parametrize("numerics", ["native", "emulate"])
def test_the_node_that_overflowed_is_named_not_the_fetched_one(monkeypatch, caplog, numerics):
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", numerics)
    values = run_three_times(two_layer_graph(), np.full([2, 4], 300.0, np.float32), caplog)
    assert not np.isfinite(values[0]).any()
    assert "returned inf/nan in 'out:0'" in caplog.text
    (line,) = origin_lines(caplog)
    assert "'kernel' (MatMul) is the first float16 node computing inf/nan" in line
    # kept float32 with the nodes its 1.2e5 reaches in half: the ReLU passes it on to 'out'
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^kernel$,^Relu$,^out$'" in line and "DENYLIST_ADD=MatMul" in line
    np.testing.assert_array_equal(values[1], values[0])  # the search changes nothing it returns
    assert np.isfinite(values[2]).all()  # healed


@pytest.mark.parametrize("numerics", ["native", "emulate"])
def test_a_float32_value_past_the_half_range_names_its_half_readers(monkeypatch, caplog, numerics):
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", numerics)
    run_three_times(two_layer_graph("exp"), np.full([2, 4], 12.0, np.float32), caplog)  # e^12 = 1.6e5
    (line,) = origin_lines(caplog)
    assert "the float32 value of 'grow' (Exp) does not fit float16 where 'kernel' reads it" in line
    assert "TFAMP_REWRITE_NODES_TO_EXCLUDE='^kernel$'" in line  # a MatMul computes a value of its own


def float32_then_runs_and_heals(graph, value, runs, caplog):
    """``(float32's 'out:0', ours over ``runs`` runs, our session's heals)`` fed x = value."""
    with tf1.Session(graph=graph) as plain:
        expected = plain.run("out:0", {"x:0": value})
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"):
        with Session(graph=graph) as session:
            values = [session.run("out:0", {"x:0": value}) for _ in range(runs)]
            return expected, values, session.heals


def test_inference_runs_heal_each_node_their_search_finds_until_they_are_finite(caplog):
    """exp(12) = 1.6e5 does not fit where 'kernel' reads it; kept float32, its own 6.5e7
    does not fit where the half nodes after it read it: each run returning inf/nan after a
    heal looks again, and once they are float32 the runs return what float32 does."""
    expected, values, heals = float32_then_runs_and_heals(
        two_layer_graph("exp"), np.full([2, 4], 12.0, np.float32), 6, caplog)
    assert not np.isfinite(values[0]).all()
    assert heals[0].nodes[:1] == ["kernel"] and len(heals) >= 2
    assert heals[0].trajectory == "an inference run's inf/nan, traced to its node"
    np.testing.assert_allclose(values[-1], expected, rtol=1e-2)


def test_every_origin_of_a_run_independent_of_the_first_is_healed_with_it(caplog):
    """Five Gram matrices of 0..255 features (a style loss) overflow each on its own: one
    search finds them all, one heal keeps them float32, and the next run is finite."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [16, 8], name="x")
        grams = [tf.matmul(x * float(k + 1), x * float(k + 1), transpose_a=True, name="gram%d" % k)
                 for k in range(5)]
        tf.identity(tf.add_n([tf.reduce_mean(g) * 1e-6 for g in grams]), name="out")
    expected, values, heals = float32_then_runs_and_heals(
        graph, np.full([16, 8], 255.0, np.float32), 3, caplog)
    (heal,) = heals
    assert sorted(heal.nodes) == ["gram%d" % k for k in range(5)]
    (line,) = origin_lines(caplog)
    assert "and 4 more start on their own" in line
    assert not np.isfinite(values[0]) and np.isclose(values[2], expected, rtol=1e-2)


def test_a_tf1_conds_merge_carrying_an_inf_from_above_is_no_origin_of_its_own(caplog):
    """Dropout as a TF1 cond between two layers: its branches cannot be watched, and the
    Merge carrying the first layer's inf was named as starting on its own."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        training = tf1.placeholder_with_default(False, [], name="training")
        hidden = tf.matmul(x, tf.constant(np.full((4, 16), 100.0, np.float32)), name="kernel")
        dropped = tf1.layers.dropout(tf.nn.relu(hidden), 0.1, training=training)
        tf.matmul(dropped, tf.constant(np.full((16, 2), 0.01, np.float32)), name="out")
    assert any(op.type == "Merge" for op in graph.get_operations())
    float32_then_runs_and_heals(graph, np.full([2, 4], 300.0, np.float32), 3, caplog)
    first = origin_lines(caplog)[0]
    assert "'kernel'" in first and "start on its own" not in first and "starts on its own" not in first


def test_a_fed_inf_is_said_to_start_outside_float16(caplog):
    """Said once the search's runs all showed it starting there: one run rules nothing out."""
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), Session(graph=two_layer_graph()) as session:
        for runs in range(origin_search.ORIGIN_RUNS + 1):
            session.run("out:0", {"x:0": np.full([2, 4], np.inf, np.float32)})
            assert len(origin_lines(caplog)) == (1 if runs == origin_search.ORIGIN_RUNS else 0)
    (line,) = origin_lines(caplog)
    assert "the fed value 'x:0' holds it before any float16 node reads it" in line


def test_a_half_node_overflowing_beside_a_fed_nan_is_still_healed(caplog):
    """An L-BFGS or hand-written descent on a fed image feeds back the NaN image that a
    float16 overflow (a style Gram of a constant image) made: the first run searching saw
    the fed NaN first, said mixed precision did not cause it, and never looked again."""
    graph = tf.Graph()
    with graph.as_default():
        image = tf1.placeholder(tf.float32, [2, 4], name="x")
        style = tf.constant(np.full((2, 4), 300.0, np.float32))
        gram = tf.matmul(style, style, transpose_b=True, name="style_gram")  # 3.6e5: past float16
        content = tf.matmul(image, tf.constant(np.ones((4, 2), np.float32)), name="content")
        tf.identity(tf.reduce_sum(gram) * 1e-6 + tf.reduce_sum(content), name="out")
    finite = np.ones([2, 4], np.float32)
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), Session(graph=graph) as session:
        first = session.run("out:0", {"x:0": finite})
        session.run("out:0", {"x:0": np.full([2, 4], np.nan, np.float32)})  # the NaN fed back
        after = session.run("out:0", {"x:0": finite})
        healed = [name for heal in session.heals for name in heal.nodes]
    assert not np.isfinite(first) and np.isfinite(after)
    assert "style_gram" in healed
    assert not [line for line in origin_lines(caplog) if "starts outside" in line]


def test_runs_that_show_no_inf_stop_the_search_after_a_few(caplog):
    graph = two_layer_graph()
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with Session(graph=graph) as session:
            session.run("out:0", {"x:0": np.full([2, 4], 300.0, np.float32)})
            watch = session._inference  # pylint: disable=protected-access
            element = session._shadow.private_fetch("out:0")  # pylint: disable=protected-access
            for _ in range(origin_search.ORIGIN_RUNS):
                assert watch.hidden_fetches([element]) is not None
                session.run("out:0", {"x:0": np.ones([2, 4], np.float32)})
            assert watch.hidden_fetches([element]) is None
    assert origin_lines(caplog) == []
    (ended,) = [r.getMessage() for r in caplog.records if "has ended" in r.getMessage()]
    assert "%d later runs found none in the float16 nodes" % origin_search.ORIGIN_RUNS in ended


def test_a_search_after_a_heal_that_finds_nothing_says_the_heal_holds(caplog, monkeypatch):
    """A write fetched with the run stores the half MatMul's inf; the heal's run wrote it
    once more, a read of the variable returned it, and the search that read started ended
    saying the inf/nan "did not recur, or starts in float32 nodes" -- right after the lines
    naming and healing the node."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        weights = tf1.placeholder(tf.float32, [None, 2], name="weights")
        moment = tf1.Variable(tf.ones([2, 4]), name="moment", use_resource=False)  # TF1's
        score = tf.reduce_mean(tf.matmul(x, 1.0 / moment, transpose_b=True, name="score"))
        store = tf1.assign(moment, tf.matmul(weights, tf.square(x), transpose_a=True, name="m_step") / 1000.0)
        init = tf1.global_variables_initializer()
    feed = {"x:0": np.full([1000, 4], 100.0, np.float32), "weights:0": np.full([1000, 2], 0.5, np.float32)}
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for _ in range(3 + origin_search.ORIGIN_RUNS):
            session.run([score, store], feed)
            stored = session.run(moment)  # the heal's run stored inf once more: read back here
        assert session.heals
    np.testing.assert_allclose(stored, np.full([2, 4], 5000.0))
    assert "has ended" not in caplog.text
    (ended,) = [r.getMessage() for r in caplog.records if "after the heal a run returned" in r.getMessage()]
    assert "the heal holds" in ended


def test_an_inf_that_float32_makes_is_said_to_start_outside_float16(caplog):
    """exp(100) overflows float32: the half MatMul before it is finite, so the search says
    the inf/nan does not start in the float16 nodes, rather than going quiet."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4], name="x")
        logits = tf.matmul(x, tf.constant(np.full((4, 2), 25.0, np.float32)), name="logits")
        tf.exp(logits, name="out")  # Exp stays float32 (deny list)
    run_three_times(graph, np.ones([2, 4], np.float32), caplog)
    (line,) = origin_lines(caplog)
    assert "does not start in the float16 nodes: a later run returned inf/nan while none" in line


def test_ssim_of_0_to_255_images_is_said_to_hide_an_overflow_and_traced(monkeypatch, caplog):
    """tf.image.ssim(max_val=255) smooths x^2 + y^2 (about 1.3e5) with a float16 depthwise
    convolution: inf, and SSIM's ratio comes out 0 -- finite.  The division by inf is said,
    and the search names the convolution, past the Reshape that only moves the value."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    graph = tf.Graph()
    with graph.as_default():
        a = tf1.placeholder(tf.float32, [2, 16, 16, 1], name="a")
        b = tf1.placeholder(tf.float32, [2, 16, 16, 1], name="b")
        tf.identity(tf.reduce_mean(tf.image.ssim(a, b, max_val=255.0)), name="ssim_value")
    rng = np.random.RandomState(0)
    image = rng.uniform(150, 255, [2, 16, 16, 1]).astype(np.float32)
    feed = {"a:0": image, "b:0": np.clip(image + rng.randn(*image.shape).astype(np.float32) * 5, 0, 255)}
    with caplog.at_level(logging.INFO, logger="tfamp_rewrite"):
        with Session(graph=graph) as session:
            values = [session.run("ssim_value:0", feed) for _ in range(3)]
    assert np.isfinite(values).all()  # the overflow does not show in what the run returns
    assert re.search(r"computed inf/nan in '[^']+', read by '[^']+' \(RealDiv\)", caplog.text)
    (line,) = origin_lines(caplog)
    assert "does not fit float16 where" in line and "ALLOWLIST_REMOVE=DepthwiseConv2dNative" in line


def test_a_hand_written_update_through_batch_norm_is_searched_and_its_poisoned_weights_named(
        caplog, monkeypatch):
    """tf.gradients + assign_sub on raw 0..65535 images: the first conv overflows float16.
    The search's own check of FusedBatchNormGradV3's outputs failed the run (their static
    shape (0,) hides scalars), and once the conv was healed, the weights the runs before
    had made NaN were said to show that 'mixed precision did not cause it'."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")  # float32 kernels: scalar reserves
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8, 8, 3])
        y = tf1.placeholder(tf.int64, [None])
        h = tf1.layers.conv2d(x, 16, 3, padding="same", use_bias=False)
        h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True))
        logits = tf1.layers.dense(tf.reduce_mean(h, [1, 2]), 4)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        params = tf1.trainable_variables()
        grads = tf.gradients(loss, params)
        train = tf.group(*[p.assign_sub(0.1 * g) for p, g in zip(params, grads)],
                         *tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
        init = tf1.global_variables_initializer()
    images = rng.randint(0, 65535, size=(16, 8, 8, 3)).astype(np.float32)
    images[0, 0, 0, 0] = 65535.0  # past float16's 65504
    labels = (images[:, 0, 0, 0] > 32767) + 2 * (images[:, 0, 0, 1] > 32767)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for _ in range(12):
            session.run([train, loss], {x: images, y: labels})
        heals = [h.nodes for h in session.heals]
    assert heals and "conv2d/Conv2D" in heals[0]
    (line,) = [m for m in origin_lines(caplog) if "starts outside float16" in m]
    assert "variable 'dense/kernel' holds it" in line and "A run before the heal" in line
    assert "did not cause it" not in line


def _segmentation_graph():
    """A half Conv3D head: its hard Dice is 0/0 on an empty volume (float32's own NaN), its
    logits overflow float16 at a gain of 3000; a PSNR of two equal frames, no half node
    upstream, is inf in float32 too."""
    graph = tf.Graph()
    with graph.as_default():
        volume = tf1.placeholder(tf.float32, [None, 4, 4, 4, 1], name="volume")
        truth = tf1.placeholder(tf.float32, [None, 4, 4, 4, 1], name="truth")
        gain = tf1.placeholder(tf.float32, [], name="gain")
        logits = tf1.layers.conv3d(volume * gain, 1, 3, padding="same", name="seg_head",
                                   kernel_initializer=tf1.constant_initializer(1.0))
        predicted = tf.cast(logits > 0, tf.float32)
        tf.identity(2 * tf.reduce_sum(predicted * truth)
                    / (tf.reduce_sum(predicted) + tf.reduce_sum(truth)), name="dice")
        tf.reduce_mean(tf.abs(logits), name="mean_logit")
        frame = tf.ones([1, 8, 8, 1])
        tf.reduce_mean(tf.image.psnr(frame, frame, max_val=1.0), name="frame_psnr")
        init = tf1.global_variables_initializer()
    return graph, init


def test_an_inf_no_half_node_computes_is_not_said(caplog):
    graph, init = _segmentation_graph()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        assert np.isinf(session.run("frame_psnr:0"))
        assert not session._inference.looking_for_origin()
    assert "frame_psnr" not in caplog.text


def test_after_a_search_finds_float32_to_blame_later_float16_overflows_are_still_healed(caplog):
    """A float32 NaN (a Dice of an empty volume) was said, searched and found float32's own;
    the session stayed silent for good after, so a later evaluation's overflow of the half
    Conv3D returned inf ever after, unsaid and unhealed."""
    graph, init = _segmentation_graph()
    empty, ones = np.zeros([1, 4, 4, 4, 1], np.float32), np.ones([1, 4, 4, 4, 1], np.float32)
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        for _ in range(3):
            session.run("dice:0", {"volume:0": -empty, "truth:0": empty, "gain:0": 1.0})
        logits = [session.run("mean_logit:0", {"volume:0": ones, "gain:0": 3000.0}) for _ in range(4)]
        heals = [h.nodes for h in session.heals]
    said = origin_lines(caplog)
    assert any("does not start in the float16 nodes" in line for line in said)
    assert any("'seg_head/Conv3D' (Conv3D) is the first float16 node" in line for line in said)
    assert heals == [["seg_head/Conv3D"]] and np.isfinite(logits[-1])


def test_a_session_closing_on_runs_whose_nan_a_variable_holds_says_so(tmp_path, caplog):
    """A scoring graph restoring a precision matrix an earlier run stored NaN in: both runs
    returned NaN, and the close said 'looked and none showed it', where both found it in
    the variable's float32 value."""
    with tf.Graph().as_default():
        precision = tf1.get_variable("precision", initializer=np.array([[np.nan, 0], [0, 1]], np.float32))
        with tf1.Session() as plain:
            plain.run(precision.initializer)
            prefix = tf1.train.Saver().save(plain, str(tmp_path / "model"))
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 2], name="x")
        precision = tf1.get_variable("precision", [2, 2])
        score = tf.reduce_sum(tf.matmul(x, precision) * x, axis=1)
        saver = tf1.train.Saver()
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        saver.restore(session, prefix)
        for _ in range(2):
            assert np.isnan(session.run(score, {x: np.ones([3, 2], np.float32)})).all()
    (closed,) = [r.getMessage() for r in caplog.records if "a session closed while looking" in r.getMessage()]
    read = "MatMul/ReadVariableOp:0" if tf1.resource_variables_enabled() else "precision/read:0"
    assert "it was in a fed or float32 value already (%r)" % read in closed
    assert "none showed it" not in closed


def test_a_search_a_steps_heal_covers_ends_unsaid(caplog):
    """A forward-only print of a layer's range returned inf; the training steps then skipped
    and their diagnosis healed that layer -- and the close said the search had found
    nothing and that float32 might be to blame."""
    from tfamp_rewrite import LossScaleOptimizer

    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 64], name="x")
        w = tf1.get_variable("w", initializer=tf.fill([64, 64], 40.0))
        y = tf.matmul(x, w)  # 64 * 40 * 40: 1e5, past float16
        largest = tf.reduce_max(tf.abs(y))
        train_op = LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1e-3), "dynamic").minimize(
            tf.reduce_mean(tf.square(y * 1e-5)))
        init = tf1.global_variables_initializer()
    feed = {x: np.full((8, 64), 40.0, np.float32)}
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        session.run(init)
        assert not np.isfinite(session.run(largest, feed))
        for _ in range(6):
            session.run(train_op, feed)
        assert session.heals and np.isfinite(session.run(largest, feed))
    assert not [r for r in caplog.records if "a session closed while looking" in r.getMessage()]


def test_a_loop_feeding_back_its_output_after_a_heal_is_not_cleared_of_float16(caplog):
    """ICP in millimetres, each run's result fed back: float16 overflowed, was healed, and the
    NaN an overflowing run returned came back through the feed -- said to start outside
    float16, 'so mixed precision did not cause it', though it did, a few runs before."""
    rng = np.random.RandomState(0)
    points = (rng.randn(400, 3) * 75 + [0, 0, 600]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        source = tf1.placeholder(tf.float32, [400, 3], name="source")
        target = tf.constant(points + 5.0)
        distances = (tf.reduce_sum(source * source, 1, keepdims=True)
                     - 2 * tf.matmul(source, target, transpose_b=True)
                     + tf.transpose(tf.reduce_sum(target * target, 1, keepdims=True)))
        matched = tf.gather(target, tf.argmin(distances, 1))
        mean_source = tf.reduce_mean(source, 0, keepdims=True)
        mean_matched = tf.reduce_mean(matched, 0, keepdims=True)
        cross = tf.matmul(source - mean_source, matched - mean_matched, transpose_a=True, name="cross")
        _, u, v = tf1.svd(cross)
        moved = tf.transpose(tf.matmul(tf.matmul(v, u, transpose_b=True), source - mean_source,
                                       transpose_b=True)) + mean_matched
    current = points
    with caplog.at_level(logging.WARNING, logger="tfamp_rewrite"), Session(graph=graph) as session:
        for _ in range(12):
            current = session.run(moved, {source: current})
        assert session.heals
    (line,) = [r.getMessage() for r in caplog.records if "starts outside float16" in r.getMessage()]
    assert "but this session healed a float16 overflow before them" in line and "feeds back" in line

"""unscale_and_check_finite against numpy, through the fused op and the composite fallback."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf
from fused_op_cases import (
    DTYPES,
    SPECIALS,
    FunctionRunner,
    GraphRunner,
    assert_matches_oracle,
    poison,
    random_gradients,
    random_sizes,
    run_eager,
    run_graph,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import tfamp_rewrite
from tfamp_rewrite.fused_op import build as fused_op_build
from tfamp_rewrite.fused_op import op as fused_op

OP_TYPE = fused_op.OP_TYPE


def use_composite(monkeypatch):
    """A fresh loader that is told to skip the library, as a user would with the env var."""
    monkeypatch.setenv(fused_op.DISABLE_ENV, "1")
    monkeypatch.setattr(fused_op, "_LOADER", fused_op._OpLoader())


@pytest.fixture(params=["fused", "composite"])
def implementation(request, monkeypatch):
    if request.param == "composite":
        use_composite(monkeypatch)
    else:
        assert tfamp_rewrite.fused_op_available(), "the fused op must build and load (make op)"
    return request.param


def run_in_mode(mode, arrays, inv_scale):
    if mode == "eager":
        return run_eager(arrays, inv_scale)
    if mode == "graph":
        return run_graph(arrays, inv_scale)
    if mode == "function":
        return FunctionRunner().run(arrays, inv_scale)
    raise ValueError(mode)


EAGER = pytest.param("eager", marks=pytest.mark.tf2_behavior("eager execution"))
FUNCTION = pytest.param("function", marks=pytest.mark.tf2_behavior("tf.function"))


# --- correctness against numpy -------------------------------------------------------------

@pytest.mark.parametrize("mode", ["graph", EAGER, FUNCTION])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_lists_match_numpy(implementation, mode, seed):
    """1-500 mixed-dtype tensors of 0 to millions of elements, clean and then poisoned."""
    rng = np.random.default_rng(1000 * seed + len(mode))
    arrays = random_gradients(rng, random_sizes(rng, int(rng.integers(1, 501)), num_big=seed))
    inv_scale = float(2.0 ** -rng.integers(0, 16)) * rng.uniform(0.5, 1.0)
    poisoned = poison(rng, arrays)
    if mode == "graph":  # one graph, two runs
        runner = GraphRunner(arrays)
        results = [runner.run(a, inv_scale) for a in (arrays, poisoned)]
        assert (OP_TYPE in runner.op_types()) == (implementation == "fused")
        runner.close()
    else:
        run = FunctionRunner().run if mode == "function" else run_eager  # TF2 modes
        results = [run(a, inv_scale) for a in (arrays, poisoned)]
    for (unscaled, all_finite), inputs in zip(results, (arrays, poisoned)):
        assert_matches_oracle(unscaled, all_finite, inputs, inv_scale)
    assert results[0][1] and not results[1][1]


@pytest.mark.parametrize("mode", ["graph", EAGER])
@pytest.mark.parametrize("position", ["first", "last", "middle"])
def test_one_special_in_a_big_tensor_is_found(implementation, mode, position):
    rng = np.random.default_rng(7)
    arrays = random_gradients(rng, [0, 1, 3_000_001, 17, 2_500_003], dtypes=(np.float32,))
    arrays[3] = arrays[3].astype(np.float16)
    big = arrays[2]
    index = {"first": 0, "last": big.size - 1, "middle": big.size // 2 + 12345}[position]
    big[index] = np.nan
    unscaled, all_finite = run_in_mode(mode, arrays, 0.125)
    assert_matches_oracle(unscaled, all_finite, arrays, 0.125)
    assert not all_finite


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=12, max_size=12),
    target=st.integers(0, 11),
    where=st.sampled_from(["first", "last", "random"]),
    special=st.sampled_from(SPECIALS),
    inv_scale=st.floats(2.0 ** -24, 4.0),
    seed=st.integers(0, 2**16),
)
def test_any_special_anywhere_clears_the_flag(sizes, dtypes, target, where, special,
                                              inv_scale, seed):
    assert tfamp_rewrite.fused_op_available()
    rng = np.random.default_rng(seed)
    arrays = [random_gradients(rng, [n], dtypes=(d,))[0] for n, d in zip(sizes, dtypes)]
    poisoned = arrays[target % len(arrays)]
    if poisoned.size:
        index = {"first": 0, "last": poisoned.size - 1}.get(where, seed % poisoned.size)
        poisoned[index] = special
    unscaled, all_finite = run_graph(arrays, inv_scale)
    assert_matches_oracle(unscaled, all_finite, arrays, inv_scale)
    assert all_finite == (poisoned.size == 0)


@pytest.mark.parametrize("dtype", [np.float16, DTYPES[2]], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("inv_scale", [1.0, 0.5, 3.0, 1 / 3, 2.0**-10, 65536.0])
def test_every_16_bit_pattern_rounds_like_numpy(implementation, dtype, inv_scale):
    """All 65536 encodings: subnormals, rounding ties, overflow to inf, nan payloads."""
    every_value = np.arange(2**16, dtype=np.uint16).view(dtype)
    unscaled, all_finite = run_graph([every_value], inv_scale)
    assert_matches_oracle(unscaled, all_finite, [every_value], inv_scale)


def test_flag_is_computed_on_the_inputs(implementation):
    overflows = np.array([60000.0, 1.0], np.float16)  # finite in, inf out
    unscaled, all_finite = run_graph([overflows], 2.0)
    assert all_finite and np.isinf(unscaled[0][0])
    unscaled, all_finite = run_graph([np.array([np.inf, 1.0], np.float32)], 0.0)
    assert not all_finite and np.isnan(unscaled[0][0])


def test_none_and_indexed_slices(implementation):
    values = np.array([[1.0, 2.0], [np.inf, 4.0]], np.float16)
    indices = np.array([3, 0], np.int64)
    with tf.Graph().as_default() as graph:
        slices = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([5, 2]))
        dense = tf.constant([8.0], tf.float32)
        unscaled, all_finite = tfamp_rewrite.unscale_and_check_finite([None, slices, dense], 0.5)
    assert unscaled[0] is None
    assert isinstance(unscaled[1], tf.IndexedSlices)
    with tf.compat.v1.Session(graph=graph) as session:
        (got_indices, got_shape, got_values), got_dense, finite = session.run(
            [[unscaled[1].indices, unscaled[1].dense_shape, unscaled[1].values], unscaled[2], all_finite])
    np.testing.assert_array_equal(got_indices, indices)
    np.testing.assert_array_equal(got_shape, [5, 2])
    np.testing.assert_array_equal(got_values, values * np.float16(0.5))
    np.testing.assert_array_equal(got_dense, [4.0])
    assert not bool(finite)


def test_fused_and_composite_give_identical_bits(monkeypatch):
    rng = np.random.default_rng(3)
    arrays = poison(rng, random_gradients(rng, random_sizes(rng, 60)))
    fused = run_graph(arrays, 2.0**-7)
    assert fused_op.fused_op_available()
    use_composite(monkeypatch)
    composite = run_graph(arrays, 2.0**-7)
    assert fused[1] == composite[1]
    for a, b in zip(fused[0], composite[0]):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.view(np.uint8) if a.size else a,
                                      b.view(np.uint8) if b.size else b)


# --- graph structure -----------------------------------------------------------------------

def test_one_node_per_device_and_flags_anded():
    assert tfamp_rewrite.fused_op_available()
    graph = tf.Graph()
    with graph.as_default():
        grads = []
        for device, value in (("/cpu:0", 1.0), ("/cpu:1", 2.0), ("/cpu:0", 3.0), ("/cpu:1", 4.0)):
            with tf.device(device):
                grads.append(tf.compat.v1.placeholder_with_default([value, value], [2]))
        unscaled, all_finite = tfamp_rewrite.unscale_and_check_finite(grads, 0.5)
    nodes = [op for op in graph.get_operations() if op.type == OP_TYPE]
    assert sorted(tf.DeviceSpec.from_string(n.device).device_index for n in nodes) == [0, 1]
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2}, allow_soft_placement=False)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        values, finite = session.run([unscaled, all_finite])
        assert finite and [v[0] for v in values] == [0.5, 1.0, 1.5, 2.0]
        assert not session.run(all_finite, {grads[3]: [1.0, np.inf]})


def test_tf_function_graph_holds_one_node_for_the_whole_list():
    assert tfamp_rewrite.fused_op_available()
    function = tf.function(tfamp_rewrite.unscale_and_check_finite)
    args = [tf.zeros([3], tf.float16), tf.zeros([5]), tf.zeros([2], tf.bfloat16)]
    graph = function.get_concrete_function(args, tf.constant(1.0)).graph
    assert [op.type for op in graph.get_operations()].count(OP_TYPE) == 1


def test_op_is_registered_not_differentiable():
    assert tfamp_rewrite.fused_op_available()
    with tf.Graph().as_default():
        grad = tf.compat.v1.placeholder(tf.float32, [4])
        unscaled, _ = tfamp_rewrite.unscale_and_check_finite([grad], 0.5)
        assert tf.compat.v1.gradients(unscaled[0], grad) == [None]


def test_forwarded_buffers_never_clobber_other_readers(implementation):
    """An input also read by another op must keep its values (TF only forwards sole owners)."""
    with tf.Graph().as_default() as graph:
        base = tf.compat.v1.placeholder(tf.float32, [100000])
        grad = base * 2.0  # fresh buffer, also read by `total` below
        unscaled, _ = tfamp_rewrite.unscale_and_check_finite([grad, base * 3.0], 0.5)
        with tf.control_dependencies(unscaled):
            total = tf.reduce_sum(tf.identity(grad))
        with tf.compat.v1.Session(graph=graph) as session:
            ones = np.ones(100000, np.float32)
            got, got_total = session.run([unscaled, total], {base: ones})
    np.testing.assert_array_equal(got[0], ones)
    np.testing.assert_array_equal(got[1], ones * 1.5)
    assert got_total == 200000.0


# --- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "grads, inv_scale, message",
    [
        (lambda: [tf.zeros([2])], lambda: tf.constant([0.5, 0.5]), "must be a scalar"),
        (lambda: [tf.zeros([2])], lambda: tf.constant(2), "must be a float32 scalar"),
        (lambda: [tf.zeros([2])], lambda: tf.constant(0.5, tf.float64), "tf.cast"),
        (lambda: [tf.zeros([2], tf.int32)], lambda: 0.5, "float16, float32 or bfloat16"),
        (lambda: [tf.zeros([2], tf.float64)], lambda: 0.5, "float16, float32 or bfloat16"),
        (list, lambda: 0.5, "at least one gradient"),
        (lambda: [None, None], lambda: 0.5, "at least one gradient"),
    ],
    ids=["vector_scale", "int_scale", "float64_scale", "int_grads", "float64_grads", "empty",
         "all_none"],
)
def test_bad_input_is_a_clear_error(implementation, grads, inv_scale, message):
    with tf.Graph().as_default(), pytest.raises(ValueError, match=message):
        tfamp_rewrite.unscale_and_check_finite(grads(), inv_scale())


def test_non_scalar_scale_of_unknown_shape_fails_when_run(implementation):
    with tf.Graph().as_default() as graph:
        scale = tf.compat.v1.placeholder(tf.float32, None)
        outputs = tfamp_rewrite.unscale_and_check_finite([tf.ones([2])], scale)
        with tf.compat.v1.Session(graph=graph) as session:
            unscaled, all_finite = session.run(outputs, {scale: 0.5})
            assert all_finite and list(unscaled[0]) == [0.5, 0.5]
            with pytest.raises(tf.errors.InvalidArgumentError):
                session.run(outputs, {scale: [0.5, 0.5]})


def test_raw_op_rejects_bad_input():
    assert tfamp_rewrite.fused_op_available()
    op = fused_op._LOADER.module().unscale_and_check_finite
    with tf.Graph().as_default() as graph:
        with pytest.raises((TypeError, ValueError), match="int32"):
            op([tf.zeros([2], tf.int32)], 1.0)
        with pytest.raises((TypeError, ValueError)):
            op([], 1.0)
        with pytest.raises(ValueError, match="rank 0"):
            op([tf.zeros([2])], [1.0, 2.0])
        scale = tf.compat.v1.placeholder(tf.float32, None)  # shape only known at run time
        _, all_finite = op([tf.zeros([2])], scale)
        with tf.compat.v1.Session(graph=graph) as session, pytest.raises(
                tf.errors.InvalidArgumentError, match="inv_scale must be a scalar"):
            session.run(all_finite, {scale: [0.5]})


# --- fallback ------------------------------------------------------------------------------

def _fallback_records(caplog):
    return [r for r in caplog.records
            if r.name == fused_op.__name__ and r.levelno == logging.WARNING]


def test_disabled_library_falls_back_and_says_so_once(monkeypatch, caplog):
    use_composite(monkeypatch)
    with caplog.at_level(logging.INFO, logger=fused_op.__name__):
        first = run_graph([np.array([2.0, np.nan], np.float32)], 0.5)
        second = run_graph([np.array([4.0], np.float16)], 0.5)
    assert not tfamp_rewrite.fused_op_available()
    records = _fallback_records(caplog)
    assert len(records) == 1 and fused_op.DISABLE_ENV in records[0].getMessage()
    assert first[1] is False and first[0][0][0] == 1.0 and np.isnan(first[0][0][1])
    assert second == ([np.array([2.0], np.float16)], True)


@pytest.mark.parametrize("failure", ["build_fails", "library_does_not_load"])
def test_broken_library_falls_back_with_the_reason(monkeypatch, caplog, tmp_path, failure):
    if failure == "build_fails":
        def build_libraries():
            raise fused_op_build.FusedOpBuildError("g++: command not found")
        expected_reason = "g++: command not found"
    else:
        broken = tmp_path / "libbroken.so"
        broken.write_text("not an ELF file")

        def build_libraries():
            return fused_op_build.Libraries(tmp_path, broken, None, "no nvcc found", None)
        expected_reason = str(broken)
    monkeypatch.delenv(fused_op.DISABLE_ENV, raising=False)
    monkeypatch.setattr(fused_op_build, "build_libraries", build_libraries)
    monkeypatch.setattr(fused_op, "_LOADER", fused_op._OpLoader())
    with caplog.at_level(logging.WARNING, logger=fused_op.__name__), \
            tf.Graph().as_default() as graph:
        tfamp_rewrite.unscale_and_check_finite([tf.zeros([2])], 0.5)
        tfamp_rewrite.unscale_and_check_finite([tf.zeros([2])], 0.5)
    assert OP_TYPE not in [op.type for op in graph.get_operations()]
    records = _fallback_records(caplog)
    assert len(records) == 1 and expected_reason in records[0].getMessage()


def test_cuda_tensorflow_without_a_gpu_kernel_gets_a_warning(monkeypatch, caplog):
    built = fused_op_build.build_libraries()
    without_gpu = built._replace(cpu=built.preferred, gpu=None, gpu_skipped="no nvcc found")
    monkeypatch.delenv(fused_op.DISABLE_ENV, raising=False)
    monkeypatch.setattr(fused_op_build, "build_libraries", lambda: without_gpu)
    monkeypatch.setattr(tf.test, "is_built_with_cuda", lambda: True)
    monkeypatch.setattr(fused_op, "_LOADER", fused_op._OpLoader())
    with caplog.at_level(logging.WARNING, logger=fused_op.__name__):
        assert tfamp_rewrite.fused_op_available()
    (record,) = _fallback_records(caplog)
    assert "no GPU kernel" in record.getMessage() and "no nvcc found" in record.getMessage()

"""RoundToHalf is TensorFlow's own CPU ``Cast(Cast(x, half), float32)``, bit for bit, on every path.

The oracle is TensorFlow's Cast pair itself, run in the same process on the same values:
special values in every vector lane and tail position, millions of random bit patterns
spanning all of float32 (nan payloads and float32 subnormals included), and every rounding
tie of both half types -- on each CPU path (AVX-512, AVX2 + F16C, scalar) this CPU has.
(One documented difference, a bfloat16 nan's sign: see tests/support/rounding_cases.py.)
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf
from rounding_cases import assert_rounds_like_casts, random_bits, specials_at_every_position
from tensorflow.python.framework import kernels

from tfamp_rewrite.fused_op import op as fused_op
from tfamp_rewrite.fused_op import round_to_half as rounding

tf1 = tf.compat.v1
HALF_TYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16}


@pytest.fixture(scope="module", autouse=True)
def library():
    assert rounding.round_to_half_available(), "the op library must build and load (make op)"


def cast_pair_and_op(tensors, half):
    """``[(TensorFlow's Cast pair, RoundToHalf)]`` of each array of float32 bits, as bits."""
    graph = tf.Graph()
    with graph.as_default():
        inputs = [tf1.placeholder(tf.float32, bits.shape) for bits in tensors]
        fetches = [(tf.cast(tf.cast(x, HALF_TYPES[half]), tf.float32), rounding.round_to_half(x, half))
                   for x in inputs]
    with tf1.Session(graph=graph) as session:
        results = session.run(fetches, {x: bits.view(np.float32) for x, bits in zip(inputs, tensors)})
    return [(want.view(np.uint32), got.view(np.uint32)) for want, got in results]


def assert_same_bits(bits, half):
    """RoundToHalf of ``bits`` (an array of float32 bits, or a list of them: one tensor each)
    is TensorFlow's Cast pair's."""
    tensors = bits if isinstance(bits, list) else [bits]
    for tensor, (want, got) in zip(tensors, cast_pair_and_op(tensors, half)):
        assert_rounds_like_casts(tensor, want, got, half)


@pytest.mark.parametrize("half", sorted(HALF_TYPES))
def test_special_values_in_every_lane_and_tail_position(cpu_isa, half):
    """Tensors around the 8- and 16-lane widths; across the rotations every special value
    sits at every position of each."""
    assert_same_bits(specials_at_every_position((1, 7, 8, 9, 15, 16, 17, 33, 48)), half)


@pytest.mark.parametrize("half", sorted(HALF_TYPES))
def test_random_bits_across_all_of_float32(cpu_isa, half):
    """2^21 + 3 uniform bit patterns (every exponent, sign, nan and subnormal), then the same
    count of values around each half type's range."""
    rng = np.random.default_rng(1)
    size = (1 << 21) + 3
    assert_same_bits(random_bits(rng, size), half)
    exponents = rng.integers(100, 150, size).astype(np.uint32) if half == "float16" else \
        rng.integers(0, 256, size).astype(np.uint32)
    near_range = (exponents << 23) | rng.integers(0, 1 << 23, size).astype(np.uint32) | \
        (rng.integers(0, 2, size).astype(np.uint32) << 31)
    assert_same_bits(near_range, half)


@pytest.mark.parametrize("half", sorted(HALF_TYPES))
def test_every_rounding_tie_and_its_neighbours(cpu_isa, half):
    """For every sign and exponent: dropped bits just below, at and just above half an ulp,
    with the kept bit even and odd (float16: the 13 dropped bits; bfloat16: 16)."""
    dropped = 13 if half == "float16" else 16
    tie = np.uint32(1 << (dropped - 1))
    high = (np.arange(512, dtype=np.uint32) << 23)[:, None]   # sign and exponent
    kept = np.array([0, 1 << dropped, 3 << dropped, 0x7FFFFF & ~((1 << dropped) - 1)], np.uint32)
    low = np.array([tie - 1, tie, tie + 1, 0, (1 << dropped) - 1], np.uint32)
    assert_same_bits((high | (kept[:, None] | low[None, :]).ravel()[None, :]).ravel(), half)


@pytest.mark.parametrize("shape", [[0], [1], [3, 5], [4999], [5000], [5001], [2, 3, 65537]],
                         ids=lambda shape: "x".join(map(str, shape)))
def test_any_shape_and_length(cpu_isa, shape):
    """Empty, tiny, around the size from which the work is sharded, multi-dimensional."""
    bits = random_bits(np.random.default_rng(2), shape)
    for half in HALF_TYPES:
        assert_same_bits(bits, half)


def output_buffers(forward):
    """RoundToHalf of ``y = x * 2``: (whether it wrote into y's buffer, its values, y's values).
    ``forward``: nothing else reads y, so TensorFlow may hand y's buffer to the op."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4096])
        y = tf.multiply(x, 2.0, name="y")
        rounded = tf.identity(rounding.round_to_half(y, name="round"))
        fetches = [rounded, tf.identity(y)] if not forward else [rounded, tf.zeros([])]
    metadata = tf1.RunMetadata()
    values = np.linspace(-70000, 70000, 4096, dtype=np.float32)
    with tf1.Session(graph=graph) as session:
        got, read = session.run(fetches, {x: values}, options=tf1.RunOptions(
            trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
    pointers = {stats.node_name: stats.output[0].tensor_description.allocation_description.ptr
                for device in metadata.step_stats.dev_stats for stats in device.node_stats
                if stats.node_name in ("y", "round") and stats.output}
    assert len(pointers) == 2 and pointers["y"] != 0
    with np.errstate(over="ignore"):  # beyond 65520: inf, as it should
        np.testing.assert_array_equal(got, (2 * values).astype(np.float16).astype(np.float32))
    return pointers["y"] == pointers["round"], read, 2 * values


def test_rounds_in_place_when_nothing_else_reads_its_input():
    in_place, _, _ = output_buffers(forward=True)
    assert in_place


def test_leaves_an_input_other_nodes_read_alone():
    in_place, read, expected = output_buffers(forward=False)
    assert not in_place
    np.testing.assert_array_equal(read, expected)


def test_gradient_is_the_cast_pairs():
    """Cast's gradient casts back: through the pair, the gradient is rounded the same way."""
    with tf.Graph().as_default() as graph:
        x = tf.constant(np.float32([1.0, 3.0]))
        scale = tf.constant(np.float32([1 + 2.0 ** -12, 70000.0]))
        (got,) = tf.gradients(rounding.round_to_half(x) * scale, [x])
        (want,) = tf.gradients(tf.cast(tf.cast(x, tf.float16), tf.float32) * scale, [x])
    with tf1.Session(graph=graph) as session:
        got, want = session.run([got, want])
    np.testing.assert_array_equal(got, want)
    assert got[0] == 1.0 and np.isinf(got[1])


def test_only_a_cpu_kernel_is_registered():
    registered = kernels.get_registered_kernels_for_op(rounding.ROUND_OP_TYPE).kernel
    assert [kernel.device_type for kernel in registered] == ["CPU"]


def test_rejects_other_types():
    with tf.Graph().as_default(), pytest.raises(ValueError, match="float16 or bfloat16; got float32"):
        rounding.round_to_half(tf.zeros([2]), tf.float32)


# --- where the Cast pair stands in --------------------------------------------------------

def fresh_choice(monkeypatch):
    monkeypatch.setattr(fused_op, "_LOADER", fused_op._OpLoader())
    monkeypatch.setattr(rounding, "_CHOICE", rounding._RoundingChoice())


def cast_pair_records(caplog):
    return [r for r in caplog.records if r.name == fused_op.__name__ and "Cast pairs" in r.getMessage()]


def rounds_with_casts():
    with tf.Graph().as_default() as graph:
        rounded = rounding.round_to_half(tf.constant([65520.0, 1.0 + 2.0 ** -11]))
    assert rounding.ROUND_OP_TYPE not in {op.type for op in graph.get_operations()}
    with tf1.Session(graph=graph) as session:
        np.testing.assert_array_equal(session.run(rounded), [np.inf, 1.0])


def cast_pair_fallback_message(monkeypatch, caplog) -> str:
    """With a fresh choice: RoundToHalf is unavailable, Casts round; the one log line saying so."""
    fresh_choice(monkeypatch)
    with caplog.at_level(logging.INFO, logger=fused_op.__name__):
        assert not rounding.round_to_half_available()
        rounds_with_casts()
    (record,) = cast_pair_records(caplog)
    return record.getMessage()


def test_disabled_library_rounds_with_casts_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setenv(fused_op.DISABLE_ENV, "1")
    assert fused_op.DISABLE_ENV in cast_pair_fallback_message(monkeypatch, caplog)


def test_a_visible_gpu_rounds_with_casts(monkeypatch, caplog):
    """RoundToHalf has a CPU kernel only: on a GPU machine the Casts stay on the GPU."""
    physical_device = getattr(tf.config, "PhysicalDevice", None)
    if physical_device is None:
        pytest.skip("TensorFlow 1.15 has no tf.config.PhysicalDevice to stand for a GPU")
    gpu = physical_device(name="/physical_device:GPU:0", device_type="GPU")
    monkeypatch.setattr(tf.config.experimental, "list_physical_devices",
                        lambda kind=None: [gpu] if kind == "GPU" else [])
    message = cast_pair_fallback_message(monkeypatch, caplog)
    assert "GPU is visible" in message and "CPU kernel only" in message


def test_rounding_op_alone_can_be_disabled_and_the_unscale_op_stays(monkeypatch, caplog):
    monkeypatch.setenv(rounding.DISABLE_ENV, "1")
    assert rounding.DISABLE_ENV in cast_pair_fallback_message(monkeypatch, caplog)
    assert fused_op.loader().module() is not None  # UnscaleAndCheckFinite is still fused

"""Every instruction-set path of the CPU kernel returns numpy's bits: AVX-512, AVX2 + F16C, scalar.

The kernel picks its path when TensorFlow constructs it (once per session) from what the
CPU has, capped by ``TFAMP_CPU_ISA``: so every path this CPU can run is tested on it, and a
path it cannot run skips with the reason.  An AVX-512 machine thus also tests the AVX2 path
an AVX2-only machine takes.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from cpu_features import ISAS
from fused_op_cases import DTYPES, SPECIALS, assert_matches_oracle, poison, random_gradients, random_sizes

import tfamp_rewrite
from tfamp_rewrite.fused_op import op as fused_op

tf1 = tf.compat.v1


class Runner:
    """One graph and session over arrays of fixed shapes and dtypes.  ``in_place``: the op
    reads ``x * 1`` (a buffer nothing else holds), so it writes into its input."""

    def __init__(self, like, in_place=False):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.inputs = [tf1.placeholder(tf.as_dtype(a.dtype), a.shape) for a in like]
            grads = [x * tf.constant(1, x.dtype) for x in self.inputs] if in_place else self.inputs
            self.inv_scale = tf1.placeholder(tf.float32, [])
            self.outputs = tfamp_rewrite.unscale_and_check_finite(grads, self.inv_scale)
        self.session = tf1.Session(graph=self.graph)

    def run(self, arrays, inv_scale):
        feed = dict(zip(self.inputs, arrays))
        feed[self.inv_scale] = inv_scale
        unscaled, all_finite = self.session.run(self.outputs, feed)
        return unscaled, bool(all_finite)


@pytest.mark.parametrize("in_place", [False, True], ids=["copy", "in_place"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_lists_match_numpy(cpu_isa, seed, in_place):
    rng = np.random.default_rng(seed)
    arrays = random_gradients(rng, random_sizes(rng, 40, num_big=1))
    runner = Runner(arrays, in_place)
    for values in (arrays, poison(rng, arrays)):
        inv_scale = float(2.0 ** rng.integers(-16, 4))
        unscaled, all_finite = runner.run(values, inv_scale)
        assert_matches_oracle(unscaled, all_finite, values, inv_scale)


@pytest.mark.parametrize("dtype", [np.float16, DTYPES[2]], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("inv_scale", [1.0, 1 / 3, 2.0**-10, 65536.0])
def test_every_16_bit_pattern_rounds_like_numpy(cpu_isa, dtype, inv_scale):
    """All 65536 encodings, in vector bodies and the scalar tail (65536 + 13 elements)."""
    every_value = np.concatenate([np.arange(2**16, dtype=np.uint16), np.arange(13, dtype=np.uint16)])
    values = [every_value.view(dtype)]
    unscaled, all_finite = Runner(values).run(values, inv_scale)
    assert_matches_oracle(unscaled, all_finite, values, inv_scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "float32", "bfloat16"])
def test_a_special_in_every_lane_and_tail_position_is_found(cpu_isa, dtype):
    """inf/nan at each position of tensors around the 8- and 16-element vector widths."""
    rng = np.random.default_rng(3)
    for size in (1, 7, 8, 9, 16, 17, 33):
        runner = Runner([np.zeros(size, dtype)])
        for position in range(size):
            values = (rng.standard_normal(size) * 4).astype(dtype)
            values[position] = SPECIALS[position % len(SPECIALS)]
            unscaled, all_finite = runner.run([values], 0.25)
            assert not all_finite, (size, position)
            assert_matches_oracle(unscaled, all_finite, [values], 0.25)


def test_a_cap_above_this_cpu_or_unknown_is_this_cpus_best(monkeypatch):
    assert tfamp_rewrite.fused_op_available()
    monkeypatch.delenv(fused_op.CPU_ISA_ENV, raising=False)
    best = fused_op.cpu_kernel_isa()
    assert best in ISAS
    for cap, expected in (("avx512", best), ("sse9", best), ("scalar", "scalar")):
        monkeypatch.setenv(fused_op.CPU_ISA_ENV, cap)
        assert fused_op.cpu_kernel_isa() == expected

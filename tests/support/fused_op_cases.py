"""Gradient lists for the unscale_and_check_finite tests, the numpy oracle, and runners.

The oracle is the contract in numpy: ``g * inv_scale`` in float32, rounded to g's dtype
(numpy and ml_dtypes round to nearest even, as TensorFlow's Cast does), and all_finite
over the inputs. TensorFlow runs CPU kernels with denormals flushed to zero (FTZ/DAZ),
so the float32 product is flushed the same way; random data never gets there anyway,
only the exhaustive bfloat16 test does.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfamp_rewrite

BFLOAT16 = tf.bfloat16.as_numpy_dtype
DTYPES = (np.float16, np.float32, BFLOAT16)
SPECIALS = (np.inf, -np.inf, np.nan)
_TINY = np.finfo(np.float32).tiny


def _flush_denormals(x):
    return np.where(np.abs(x) < _TINY, np.float32(0) * x, x).astype(np.float32)


def expected(arrays, inv_scale):
    """What unscale_and_check_finite must return for numpy ``arrays``."""
    s = np.float32(inv_scale)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and nan are expected here
        unscaled = [
            _flush_denormals(_flush_denormals(a.astype(np.float32)) * s).astype(a.dtype)
            for a in arrays
        ]
    all_finite = all(bool(np.isfinite(a.astype(np.float32)).all()) for a in arrays)
    return unscaled, all_finite


def assert_matches_oracle(unscaled, all_finite, arrays, inv_scale):
    want, want_finite = expected(arrays, inv_scale)
    assert all_finite == want_finite
    assert len(unscaled) == len(want)
    for i, (got, ref) in enumerate(zip(unscaled, want)):
        assert got.dtype == ref.dtype and got.shape == ref.shape, i
        # float32 holds every half/bfloat16 value exactly; nan compares equal to nan here.
        np.testing.assert_array_equal(got.astype(np.float32), ref.astype(np.float32),
                                      err_msg=f"tensor {i}")


def random_sizes(rng, count, num_big=0):
    """``count`` sizes: many small and odd (0 included), ``num_big`` of 1-4 million."""
    sizes = np.floor(np.exp(rng.uniform(0, np.log(40000), count))).astype(np.int64) - 1
    sizes[rng.random(count) < 0.05] = 0
    big = rng.choice(count, size=min(num_big, count), replace=False)
    sizes[big] = rng.integers(1_000_000, 4_000_000, size=len(big)) | 1
    return [int(s) for s in sizes]


def random_gradients(rng, sizes, dtypes=DTYPES):
    """Finite values of mixed dtypes and magnitudes, well inside each dtype's range."""
    arrays = []
    for size in sizes:
        dtype = dtypes[rng.integers(len(dtypes))]
        magnitude = 2.0 ** rng.integers(-10, 10)
        arrays.append((rng.standard_normal(size, dtype=np.float32) * magnitude).astype(dtype))
    return arrays


def poison(rng, arrays):
    """Copies of ``arrays`` with inf, -inf or nan at the first, last and a random position."""
    poisoned = []
    for a in arrays:
        a = a.copy()
        if a.size:
            for position in (0, a.size - 1, rng.integers(a.size)):
                a[position] = SPECIALS[rng.integers(len(SPECIALS))]
        poisoned.append(a)
    return poisoned


def run_graph(arrays, inv_scale):
    """``unscale_and_check_finite`` on ``arrays`` once, in a TF1 graph and session."""
    runner = GraphRunner(arrays)
    try:
        return runner.run(arrays, inv_scale)
    finally:
        runner.close()


def run_eager(arrays, inv_scale):
    """The same, executed eagerly (a TensorFlow 2 mode)."""
    unscaled, all_finite = tfamp_rewrite.unscale_and_check_finite(
        [tf.constant(a) for a in arrays], inv_scale)
    return [u.numpy() for u in unscaled], bool(all_finite)


class GraphRunner:
    """One TF1 graph with a placeholder per array; ``run`` feeds new values of same shapes."""

    def __init__(self, arrays, inv_scale=None):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.inputs = [tf.compat.v1.placeholder(tf.as_dtype(a.dtype), a.shape) for a in arrays]
            self.inv_scale = tf.compat.v1.placeholder(tf.float32, [])
            self.outputs = tfamp_rewrite.unscale_and_check_finite(self.inputs, self.inv_scale)
        self.session = tf.compat.v1.Session(graph=self.graph)

    def op_types(self):
        return [op.type for op in self.graph.get_operations()]

    def run(self, arrays, inv_scale):
        feed = dict(zip(self.inputs, arrays))
        feed[self.inv_scale] = inv_scale
        unscaled, all_finite = self.session.run(self.outputs, feed)
        return unscaled, bool(all_finite)

    def close(self):
        self.session.close()


class FunctionRunner:
    """``unscale_and_check_finite`` inside a ``tf.function``."""

    def __init__(self):
        self.function = tf.function(tfamp_rewrite.unscale_and_check_finite)

    def run(self, arrays, inv_scale):
        unscaled, all_finite = self.function([tf.constant(a) for a in arrays],
                                             tf.constant(inv_scale, tf.float32))
        return [u.numpy() for u in unscaled], bool(all_finite)

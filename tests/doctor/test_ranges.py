"""ProbeOps' in-graph reductions and RangeAccumulator's ranges agree with numpy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from tfamp_rewrite.doctor.limits import limits_for
from tfamp_rewrite.doctor.probe_ops import ProbeOps
from tfamp_rewrite.doctor.probes import ACTIVATION_GRADIENT, FORWARD, Probe
from tfamp_rewrite.doctor.ranges import RangeAccumulator

tf1 = tf.compat.v1
FP16 = limits_for("float16")
VALUES = np.array([0.0, -0.0, 1e-9, 3e-5, -1.0, 1.5, 7e4, -2.5e5, 2.0 ** -24, 2.0 ** -14], np.float32)


def measured(values, role=FORWARD, scale=1.0, runs=1):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None], name="x")
        tf.identity(x, name="y")
        tf.multiply(x, 2.0, name="unused")
    probe_ops = ProbeOps(graph, FP16)
    probe = Probe("y:0", "y", "Identity", "clear", role)
    assert probe_ops.add([probe, Probe("unused:0", "unused", "Mul", "infer", FORWARD)]) == 2
    accumulator = RangeAccumulator(FP16)
    with tf1.Session(graph=graph) as session:
        ids = probe_ops.select([graph.get_tensor_by_name("y:0")], [x])
        assert [probe_ops.probes[i].tensor for i in ids] == ["y:0"]  # what the run computes anyway
        for _ in range(runs):
            counts, extrema = session.run(probe_ops.fetches(ids), {x: values})
            accumulator.record([probe_ops.probes[i] for i in ids], counts, extrema, scale)
    return accumulator


def test_reductions_match_numpy():
    (r,) = measured(VALUES, runs=2).ranges()
    nonzero = np.abs(VALUES[VALUES != 0]).astype(np.float64)
    assert r.runs == 2 and r.elements == 2 * VALUES.size and r.zeros == 4
    assert r.max_abs == pytest.approx(2.5e5) and r.min_abs_nonzero == pytest.approx(1e-9)
    assert r.overflow == 2 * 2                                   # 7e4 and -2.5e5, twice
    expected = {}
    for value in nonzero:
        exponent = math.frexp(value)[1] - 1                      # 2**e <= |x| < 2**(e+1)
        expected[exponent] = expected.get(exponent, 0) + 2
    assert dict(map(tuple, r.histogram)) == expected
    assert r.count_below(FP16.min_subnormal_log2) == 2 * 1      # 1e-9 flushes; 2**-24 itself does not
    assert r.count_below(FP16.min_normal_log2) == 2 * 3         # 1e-9, 3e-5, 2**-24
    assert r.count_overflowing(FP16) == 4


def test_gradients_are_recorded_unscaled():
    scale = 2.0 ** 10
    accumulator = measured(VALUES * np.float32(scale), role=ACTIVATION_GRADIENT, scale=scale)
    (scaled,) = accumulator.ranges()
    (plain,) = measured(VALUES, role=ACTIVATION_GRADIENT).ranges()
    assert scaled.histogram == plain.histogram
    assert scaled.max_abs == pytest.approx(plain.max_abs) and scaled.run_scale_log2 == 10
    assert accumulator.steps[0].scale == scale and accumulator.steps[0].gradient_max == pytest.approx(2.5e5)
    # what it would be at another scale is a shift of the same histogram
    assert scaled.count_below(FP16.min_subnormal_log2, 10) == 0
    assert scaled.count_overflowing(FP16, 10) == scaled.overflow == 2


def expected_stats(values, largest):
    """numpy's ``(counts[258], [max, min nonzero])`` of one tensor (probe_ops' contract)."""
    a = np.abs(np.asarray(values, np.float32).reshape(-1))
    bins = np.where(a == 0, 256, a.view(np.int32) >> 23)
    counts = np.append(np.bincount(bins, minlength=257), np.count_nonzero(a > largest))
    nonzero = a[a != 0]
    biggest = a.max() if a.size else -np.inf  # a nan in, a nan out, as reduce_max on the CPU
    smallest = nonzero.min() if nonzero.size and not np.isnan(nonzero).all() else np.inf
    if np.isnan(nonzero).any():
        smallest = None  # a nan's place in a minimum is TensorFlow's to choose: not compared
    return counts, biggest, smallest


@pytest.mark.parametrize("group_size", [2, 3, 64])
def test_tensors_reduced_in_groups_keep_their_own_ranges(monkeypatch, group_size):
    """Concatenated and told apart by segment: every tensor's counts and extrema are its own,
    whatever its neighbours hold (inf, nan, nothing, only zeros) and however the groups fall."""
    from tfamp_rewrite.doctor import probe_ops as probe_ops_module

    monkeypatch.setattr(probe_ops_module, "GROUP_SIZE", group_size)
    rng = np.random.default_rng(0)
    values = {
        "wide": (rng.standard_normal([3, 5, 7]) * 1e5).astype(np.float32),
        "empty": np.zeros([0, 4], np.float32),
        "zeros": np.zeros([6], np.float32),
        "nan_first": np.array([np.nan, 2.0, 3.0, 7e4], np.float32),
        "inf_last": np.array([1e-30, 5.0, -np.inf], np.float32),
        "half": (rng.standard_normal([4, 9]) * 300).astype(np.float16),
        "scalar": np.array(-2.0 ** -20, np.float32),
        "tiny": np.array([1.2e-38, -1e-30, 0.0, 3e-8], np.float32),  # normal: the CPU flushes subnormals
    }
    graph = tf.Graph()
    with graph.as_default():
        feeds = {name: tf1.placeholder(v.dtype, None, name=name) for name, v in values.items()}
        outputs = [tf.identity(p, name=name + "_y") for name, p in feeds.items()]
    probe_ops = ProbeOps(graph, FP16)
    probe_ops.add([Probe(t.name, t.op.name, "Identity", "clear", FORWARD) for t in outputs])
    ids = probe_ops.select(outputs, feeds.values())
    assert len(ids) == len(values)
    with tf1.Session(graph=graph) as session:
        counts, extrema = session.run(probe_ops.fetches(ids),
                                      {feeds[name]: v for name, v in values.items()})
    for row, name in enumerate(values):
        want_counts, biggest, smallest = expected_stats(values[name], FP16.max_finite)
        np.testing.assert_array_equal(counts[row], want_counts, err_msg=name)
        np.testing.assert_equal(extrema[row][0], biggest, err_msg=name)
        if smallest is not None:
            assert extrema[row][1] == smallest, name

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

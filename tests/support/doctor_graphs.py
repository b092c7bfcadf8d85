"""Frozen graphs with one planted float16-hostile spot, for calibration and auto-tuning.

Both are ``x [None, 16] -> mm1 (MatMul) -> ... -> mm2 (MatMul) -> out``: the hostile ops sit
between two MatMuls, so the rewrite holds them in half.

* ``overflow_graph``: ``square = mm1 * mm1`` with mm1's values in the hundreds, so the
  square passes 65504 and becomes inf in float16 (then scaled back down by mm2).
* ``cancellation_graph``: ``shift = mm1 + 1000`` then ``unshift = shift - 1000``: in
  float16 values near 1000 are multiples of 0.5, so unit-sized mm1 loses its digits --
  no value overflows or flushes, so only validation (auto-tuning) can find it.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
WIDTH = 16


def _frozen(build):
    graph = tf.Graph()
    rng = np.random.default_rng(7)
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, WIDTH], name="x")
        w1 = tf.constant(rng.standard_normal([WIDTH, WIDTH]).astype(np.float32) / 4, name="w1")
        w2 = tf.constant(rng.standard_normal([WIDTH, 8]).astype(np.float32) / 4, name="w2")
        mm1 = tf.linalg.matmul(x, w1, name="mm1")
        middle = build(mm1)
        tf.identity(tf.linalg.matmul(middle, w2, name="mm2"), name="out")
    return graph.as_graph_def()


def overflow_graph():
    """mm1 * mm1 overflows float16 for inputs of a few hundred (see module docstring)."""
    return _frozen(lambda mm1: tf.multiply(tf.multiply(mm1, mm1, name="square"), 2.0 ** -16, name="rescale"))


def cancellation_graph():
    """mm1 + 1000 - 1000 loses mm1's digits in float16 (see module docstring)."""
    def build(mm1):
        shift = tf.add(mm1, 1000.0, name="shift")
        return tf.subtract(shift, 1000.0, name="unshift")
    return _frozen(build)


def inputs(scale: float, rows: int = 32, seed: int = 3) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal([rows, WIDTH]) * scale).astype(np.float32)

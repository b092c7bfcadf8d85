"""Graphs on which TensorFlow versions' AMP passes differ (graph_rewrite/compat.py)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def vae_reconstruction_graph():
    """The reconstruction loss of TF1 VAE tutorials and its gradient, as TF 1.15 builds it.

    ``log(1e-10 + sigmoid(logits))`` after a MatMul: the gradient of Log is a Reciprocal of
    ``1e-10 + p``; with p < 1.5e-5 it exceeds 65504 -- inf in float16.  TensorFlow 1.15's
    gradient of the broadcasting Add sums over BroadcastGradientArgs' axes for both operands
    (newer TensorFlow drops the Sum where shapes match), so a Sum (deny) sits between the
    Reciprocal and the weight gradient's MatMul: only infer-after-allow makes it half.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf.constant(np.full([8, 8], -2.0, np.float32), name="w")
        p = tf.sigmoid(tf.matmul(x, w, name="logits"), name="p")
        eps = tf.constant(1e-10, name="eps")
        shifted = tf.add(eps, p, name="shifted")
        tf.reduce_sum(tf1.log(shifted, name="log_p"), name="loss")
        d_log = tf1.ones_like(shifted, name="d_log")                   # dloss/dlog_p
        d_shifted = tf.multiply(d_log, tf1.reciprocal(shifted, name="reciprocal"), name="d_shifted")
        _, axes = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(eps), s1=tf.shape(p))
        d_p = tf.reshape(tf.reduce_sum(d_shifted, axes, name="d_p_sum"), tf.shape(p), name="d_p")
        d_logits = tf.raw_ops.SigmoidGrad(y=p, dy=d_p, name="d_logits")
        tf.identity(tf.matmul(x, d_logits, transpose_a=True, name="d_w_mm"), name="grad")
    return graph.as_graph_def()

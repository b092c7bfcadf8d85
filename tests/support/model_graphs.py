"""Training graphs of the kinds users rewrite, built with tf.compat.v1, as GraphDefs.

Each builder returns a ``ModelGraph``: the GraphDef, the names to fetch (train op, loss,
outputs) and to feed, and a ``feed_values(rng)`` producing a matching feed dict.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Dict, List

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


@dataclass
class ModelGraph:
    graph_def: object
    fetches: List[str]
    feeds: List[str]
    feed_values: Callable[[np.random.Generator], Dict[str, np.ndarray]]
    init: str = "init"


def _seed(seed: int) -> None:
    """Fixes the initial weights: the graph's seed, and Python's, from which Keras-backed
    tf.compat.v1.layers draw their initializers' seeds on TensorFlow 2.x."""
    tf1.set_random_seed(seed)
    random.seed(seed)


def _finish(graph, fetches, feeds, feed_values) -> ModelGraph:
    with graph.as_default():
        tf1.global_variables_initializer()  # named "init"
    return ModelGraph(graph.as_graph_def(), fetches, feeds, feed_values)


def conv_net(batch=8, size=16, classes=10, optimizer="momentum") -> ModelGraph:
    """Conv2D + batch norm + ReLU + pooling + dense, softmax cross-entropy, Momentum."""
    graph = tf.Graph()
    with graph.as_default():
        _seed(1)
        images = tf1.placeholder(tf.float32, [batch, size, size, 3], name="images")
        labels = tf1.placeholder(tf.int32, [batch], name="labels")
        net = images
        for i, filters in enumerate((8, 16)):
            net = tf1.layers.conv2d(net, filters, 3, padding="same", use_bias=False, name="conv%d" % i)
            net = tf1.layers.batch_normalization(net, training=True, name="bn%d" % i)
            net = tf.nn.relu(net)
            net = tf1.layers.max_pooling2d(net, 2, 2)
        net = tf1.layers.flatten(net)
        logits = tf1.layers.dense(net, classes, name="logits")
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        tf.identity(loss, name="loss")
        opt = tf1.train.MomentumOptimizer(0.05, 0.9) if optimizer == "momentum" else \
            tf1.train.GradientDescentOptimizer(0.1)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            opt.minimize(loss, name="train_op")
        tf.identity(logits, name="output")

    def feed_values(rng):
        return {"images:0": rng.standard_normal((batch, size, size, 3)).astype(np.float32),
                "labels:0": rng.integers(0, classes, batch).astype(np.int32)}

    return _finish(graph, ["train_op", "loss", "output"], ["images", "labels"], feed_values)


class control_flow_v1:
    """Context manager: build with TF1 control flow (Enter/Merge/Switch/NextIteration)."""

    def __enter__(self):
        self._was_v2 = tf1.control_flow_v2_enabled()
        tf1.disable_control_flow_v2()

    def __exit__(self, *exc):
        if self._was_v2:
            tf1.enable_control_flow_v2()


def lstm_classifier(batch=4, steps=6, features=8, units=16, classes=3) -> ModelGraph:
    """``tf.compat.v1.nn.dynamic_rnn`` LSTM under control flow v1, Adam."""
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        _seed(2)
        inputs = tf1.placeholder(tf.float32, [batch, steps, features], name="sequences")
        labels = tf1.placeholder(tf.int32, [batch], name="labels")
        cell = tf1.nn.rnn_cell.LSTMCell(units, name="lstm")
        outputs, _ = tf1.nn.dynamic_rnn(cell, inputs, dtype=tf.float32)
        logits = tf1.layers.dense(outputs[:, -1], classes, name="logits")
        loss = tf.identity(tf1.losses.sparse_softmax_cross_entropy(labels, logits), name="loss")
        tf1.train.AdamOptimizer(0.01).minimize(loss, name="train_op")
        tf.identity(logits, name="output")

    def feed_values(rng):
        return {"sequences:0": rng.standard_normal((batch, steps, features)).astype(np.float32),
                "labels:0": rng.integers(0, classes, batch).astype(np.int32)}

    return _finish(graph, ["train_op", "loss", "output"], ["sequences", "labels"], feed_values)


def transformer_block(batch=2, length=8, width=16, heads=2) -> ModelGraph:
    """Multi-head self-attention + layer norm + feed-forward, Adam."""
    graph = tf.Graph()
    with graph.as_default():
        _seed(3)
        x = tf1.placeholder(tf.float32, [batch, length, width], name="tokens")
        target = tf1.placeholder(tf.float32, [batch, length, width], name="target")

        def dense(t, units, name, activation=None):
            return tf1.layers.dense(t, units, activation=activation, name=name)

        def split_heads(t):
            return tf.transpose(tf.reshape(t, [batch, length, heads, width // heads]), [0, 2, 1, 3])

        def layer_norm(t, name):
            with tf1.variable_scope(name):
                mean, variance = tf.nn.moments(t, axes=[-1], keepdims=True)
                gamma = tf1.get_variable("gamma", [width], initializer=tf1.ones_initializer())
                beta = tf1.get_variable("beta", [width], initializer=tf1.zeros_initializer())
                return (t - mean) * tf.math.rsqrt(variance + 1e-6) * gamma + beta

        q, k, v = (split_heads(dense(x, width, n)) for n in ("query", "key", "value"))
        scores = tf.matmul(q, k, transpose_b=True) / np.sqrt(width // heads).astype(np.float32)
        attention = tf.matmul(tf.nn.softmax(scores, name="attention_weights"), v)
        merged = tf.reshape(tf.transpose(attention, [0, 2, 1, 3]), [batch, length, width])
        h = layer_norm(x + dense(merged, width, "attention_output"), "ln1")
        ff = dense(dense(h, 4 * width, "ffn_in", tf.nn.relu), width, "ffn_out")
        out = tf.identity(layer_norm(h + ff, "ln2"), name="output")
        loss = tf.reduce_mean(tf.square(out - target), name="loss")
        tf1.train.AdamOptimizer(1e-3).minimize(loss, name="train_op")

    def feed_values(rng):
        return {"tokens:0": rng.standard_normal((batch, length, width)).astype(np.float32),
                "target:0": rng.standard_normal((batch, length, width)).astype(np.float32)}

    return _finish(graph, ["train_op", "loss", "output"], ["tokens", "target"], feed_values)


def embedding_classifier(batch=8, length=6, vocab=64, width=8, classes=4) -> ModelGraph:
    """Fed word ids looked up in an embedding table (a reference variable, as TF1 made
    them: the pass casts the whole table to half for the gather), dense layers, softmax
    cross-entropy, Adagrad (sparse updates of the table)."""
    graph = tf.Graph()
    with graph.as_default():
        _seed(5)
        ids = tf1.placeholder(tf.int32, [batch, length], name="ids")
        labels = tf1.placeholder(tf.int32, [batch], name="labels")
        table = tf1.get_variable("embeddings", [vocab, width], use_resource=False)
        words = tf.reshape(tf.nn.embedding_lookup(table, ids), [batch, length * width])
        hidden = tf1.layers.dense(words, 16, tf.nn.relu, name="hidden")
        logits = tf.identity(tf1.layers.dense(hidden, classes, name="logits"), name="output")
        loss = tf.identity(tf1.losses.sparse_softmax_cross_entropy(labels, logits), name="loss")
        tf1.train.AdagradOptimizer(0.5).minimize(loss, name="train_op")

    def feed_values(rng):
        return {"ids:0": rng.integers(0, vocab, (batch, length)).astype(np.int32),
                "labels:0": rng.integers(0, classes, batch).astype(np.int32)}

    return _finish(graph, ["train_op", "loss", "output"], ["ids", "labels"], feed_values)


def while_loop(v2=False, size=8, iterations=3) -> ModelGraph:
    """``tf.while_loop`` repeatedly applying MatMul + Tanh (control flow v1 or v2)."""
    graph = tf.Graph()
    with graph.as_default():
        flow = _nullcontext() if v2 else control_flow_v1()
        with flow:
            x = tf1.placeholder(tf.float32, [size, size], name="x")
            w = tf.constant(np.eye(size, dtype=np.float32) * 0.5, name="w")
            _, y = tf.while_loop(lambda i, h: i < iterations,
                                 lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w)) + 0.1),
                                 [tf.constant(0), x])
            tf.identity(tf.nn.relu(tf.matmul(y, w)), name="output")

    def feed_values(rng):
        return {"x:0": rng.standard_normal((size, size)).astype(np.float32)}

    return _finish(graph, ["output"], ["x"], feed_values)


def function_call(size=8) -> ModelGraph:
    """A non-inlined Defun (MatMul + Tanh) called from the graph, then a MatMul."""
    from tensorflow.python.framework import function

    graph = tf.Graph()
    with graph.as_default():
        @function.Defun(tf.float32, tf.float32)
        def mm_tanh(a, b):
            return tf.tanh(tf.matmul(a, b))

        x = tf1.placeholder(tf.float32, [size, size], name="x")
        w = tf.constant(np.eye(size, dtype=np.float32), name="w")
        y = mm_tanh(x, w, name="call")
        y.set_shape([size, size])
        tf.identity(tf.matmul(y, w, name="mm"), name="output")

    def feed_values(rng):
        return {"x:0": rng.standard_normal((size, size)).astype(np.float32)}

    return _finish(graph, ["output"], ["x"], feed_values)


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


MODELS = {
    "conv_net_momentum": conv_net,
    "lstm_dynamic_rnn_cf_v1": lstm_classifier,
    "transformer_adam": transformer_block,
    "embedding_adagrad": embedding_classifier,
    "while_loop_cf_v1": while_loop,
    "while_loop_cf_v2": lambda: while_loop(v2=True),
    "function_call": function_call,
}

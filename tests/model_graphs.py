"""Training graphs of the kinds users rewrite, built with tf.compat.v1, as GraphDefs.

Each builder returns a ``ModelGraph``: the GraphDef, the names to fetch (train op, loss,
outputs) and to feed, and a ``feed_values(rng)`` producing a matching feed dict.
"""
from __future__ import annotations

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


def _finish(graph, fetches, feeds, feed_values) -> ModelGraph:
    with graph.as_default():
        tf1.global_variables_initializer()  # named "init"
    return ModelGraph(graph.as_graph_def(), fetches, feeds, feed_values)


def conv_net(batch=8, size=16, classes=10, optimizer="momentum") -> ModelGraph:
    """Conv2D + batch norm + ReLU + pooling + dense, softmax cross-entropy, Momentum."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
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

"""Runs a GraphDef in a fresh graph and session (Grappler off, so only our rewrite counts)."""
from __future__ import annotations

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

tf1 = tf.compat.v1


def plain_config():
    """A ConfigProto with Grappler disabled: what runs is exactly the GraphDef given."""
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.rewrite_options.auto_mixed_precision = rewriter_config_pb2.RewriterConfig.OFF
    return config


def run_graph(graph_def, fetches, feed_dict=None, init=None, train_op=None, steps=0):
    """Imports ``graph_def``, runs ``init``, then ``train_op`` ``steps`` times, then fetches.

    ``graph_def`` is not modified (TensorFlow's importer fills default attributes into the
    GraphDef it is given, so a copy is imported).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(copy_of(graph_def), name="")
    with tf1.Session(graph=graph, config=plain_config()) as session:
        if init:
            session.run(init)
        for _ in range(steps):
            session.run(train_op, feed_dict)
        return session.run(fetches, feed_dict)


def copy_of(graph_def):
    """A copy of ``graph_def``."""
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    return copy

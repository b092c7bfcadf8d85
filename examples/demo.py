"""The main demo: rewrite a TF1 conv-net training graph to mixed precision and explain it.

1. Builds a tf.compat.v1 conv net (conv + batch norm + ReLU + pooling + dense, softmax
   cross-entropy, Momentum) as a GraphDef.
2. Rewrites it with ``tfamp_rewrite.rewrite_graph_def`` (target="cpu": this machine has
   no GPU) and prints the pass summary and a few per-node decisions.
3. Trains the fp32 and the mixed-precision graph side by side for a few steps on the
   same data and prints both losses.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfamp_rewrite  # noqa: E402

tf1 = tf.compat.v1


def build_conv_net(batch=32, size=16, classes=10):
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        images = tf1.placeholder(tf.float32, [batch, size, size, 3], name="images")
        labels = tf1.placeholder(tf.int32, [batch], name="labels")
        net = images
        for i, filters in enumerate((16, 32)):
            net = tf1.layers.conv2d(net, filters, 3, padding="same", use_bias=False, name="conv%d" % i)
            net = tf1.layers.batch_normalization(net, training=True, name="bn%d" % i)
            net = tf1.layers.max_pooling2d(tf.nn.relu(net), 2, 2)
        logits = tf1.layers.dense(tf1.layers.flatten(net), classes, name="logits")
        loss = tf.identity(tf1.losses.sparse_softmax_cross_entropy(labels, logits), name="loss")
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    return graph.as_graph_def()


def train(graph_def, feeds, steps):
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    config = tf1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True  # run exactly this graph
    with tf1.Session(graph=graph, config=config) as session:
        session.run("init")
        losses = []
        for step in range(steps):
            losses.append(session.run(["loss:0", "train_op"], feeds[step % len(feeds)])[0])
    return losses


def main():
    graph_def = build_conv_net()
    result = tfamp_rewrite.rewrite_graph_def(graph_def, fetches=["train_op", "loss"],
                                             feeds=["images", "labels"], target="cpu")
    print(result.report.summary(max_op_rows=12))
    print("\nSome decisions:")
    for name in ("conv0/Conv2D", "bn0/FusedBatchNormV3", "Relu", "logits/MatMul",
                 "sparse_softmax_cross_entropy_loss/xentropy/xentropy", "loss"):
        d = result.report.decision(name)
        print("  %-55s %-9s %s" % (name, d.dtype, d.reason))

    rng = np.random.default_rng(0)
    centers = rng.standard_normal((10, 16, 16, 3)).astype(np.float32)
    feeds = []
    for _ in range(4):
        labels = rng.integers(0, 10, 32).astype(np.int32)
        images = centers[labels] + 0.5 * rng.standard_normal((32, 16, 16, 3)).astype(np.float32)
        feeds.append({"images:0": images, "labels:0": labels})
    steps = 20
    fp32 = train(graph_def, feeds, steps)
    amp = train(result.graph_def, feeds, steps)
    print("\nTraining %d steps on the CPU, same data and initial weights:" % steps)
    print("  %6s %12s %12s" % ("step", "fp32 loss", "AMP loss"))
    for step in (0, 4, 9, 14, 19):
        print("  %6d %12.4f %12.4f" % (step, fp32[step], amp[step]))
    if not amp[-1] < amp[0]:
        print("mixed-precision training did not reduce the loss", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""ResNet-50 v1.5 in TF1 graph mode: NHWC, ``tf.compat.v1.layers``.

v1.5 differs from the original v1 in one place: a bottleneck block that halves the
resolution does it in its 3x3 convolution, not in the first 1x1.  The network::

    stem:   conv 7x7/2 (width) - BN - ReLU - max pool 3x3/2
    stages: len(blocks) stages of bottleneck blocks; stage s has blocks[s] blocks of
            width * 2**s channels inside and 4x that outside; every stage but the
            first starts with stride 2
    head:   global average pool - dense(num_classes)

``width=64, blocks=(3, 4, 6, 3)`` is ResNet-50; a smaller width or fewer blocks keep
the same structure (CI runs ``width=8, blocks=(1, 1, 1, 1)``).  The last batch norm of
each block starts at zero ("zero-gamma"), so every block starts as the identity.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

tf1 = tf.compat.v1
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def _conv_bn(net, filters, kernel, strides, training, relu=True, zero_gamma=False, name=None):
    with tf1.variable_scope(name):
        net = tf1.layers.conv2d(
            net, filters, kernel, strides=strides, padding="same", use_bias=False,
            kernel_initializer=tf1.variance_scaling_initializer(2.0, "fan_in", "truncated_normal"),
            name="conv2d")
        net = tf1.layers.batch_normalization(
            net, momentum=BN_MOMENTUM, epsilon=BN_EPSILON, training=training, fused=True,
            gamma_initializer=tf1.zeros_initializer() if zero_gamma else tf1.ones_initializer(),
            name="batch_normalization")
        return tf.nn.relu(net) if relu else net


def bottleneck_block(net, width, strides, training, name):
    """1x1 (width) - 3x3/strides (width) - 1x1 (4 * width), plus the shortcut, then ReLU."""
    with tf1.variable_scope(name):
        out_filters = 4 * width
        if strides != 1 or net.shape[-1] != out_filters:
            shortcut = _conv_bn(net, out_filters, 1, strides, training, relu=False, name="shortcut")
        else:
            shortcut = net
        net = _conv_bn(net, width, 1, 1, training, name="conv1")
        net = _conv_bn(net, width, 3, strides, training, name="conv2")
        net = _conv_bn(net, out_filters, 1, 1, training, relu=False, zero_gamma=True, name="conv3")
        return tf.nn.relu(net + shortcut)


def resnet_v15(images, num_classes: int, training: bool, width: int = 64,
               blocks: Sequence[int] = (3, 4, 6, 3)):
    """Logits ``[batch, num_classes]`` for NHWC ``images`` (see the module docstring)."""
    with tf1.variable_scope("resnet50_v1.5"):
        net = _conv_bn(images, width, 7, 2, training, name="stem")
        net = tf1.layers.max_pooling2d(net, 3, 2, padding="same", name="stem/max_pool")
        for stage, count in enumerate(blocks):
            for block in range(count):
                strides = 2 if stage > 0 and block == 0 else 1
                net = bottleneck_block(net, width * 2 ** stage, strides, training,
                                       name="stage%d/block%d" % (stage + 1, block + 1))
        net = tf.reduce_mean(net, axis=[1, 2], name="global_avg_pool")
        return tf1.layers.dense(net, num_classes,
                                kernel_initializer=tf1.random_normal_initializer(stddev=0.01),
                                name="logits")

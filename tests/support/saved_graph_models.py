"""Saved graphs for the command-line tests: frozen GraphDefs, a MetaGraph, a SavedModel, ResNet-50.

Every builder writes into a directory it is given and returns the paths; weights are
random with fixed seeds, so every run builds the same files.
"""
from __future__ import annotations

import os
from typing import Dict

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def explain_graph():
    """A small frozen classifier whose decisions are known (see test_cli_explain.py).

    x -> mm (MatMul, w) -> bias (BiasAdd, b) -> relu -> exp -> add(relu, exp) -> softmax -> probs
    """
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        w = tf.constant(rng.standard_normal([16, 12]).astype(np.float32) * 0.25, name="w")
        b = tf.constant(np.full([12], 0.1, np.float32), name="b")
        relu = tf.nn.relu(tf.nn.bias_add(tf.linalg.matmul(x, w, name="mm"), b, name="bias"), name="relu")
        exp = tf.exp(relu, name="exp")
        softmax = tf.nn.softmax(tf.add(relu, exp, name="add"), name="softmax")
        tf.identity(softmax, name="probs")
    return graph.as_graph_def()


def write_frozen(graph_def, path: str, text: bool = False) -> str:
    from google.protobuf import text_format

    data = text_format.MessageToString(graph_def).encode() if text else graph_def.SerializeToString()
    with open(path, "wb") as handle:
        handle.write(data)
    return path


def _dense_net(images):
    """conv(3->8) -> relu -> conv(8->16) -> relu -> mean -> dense(16->10): variables."""
    init = tf1.initializers.glorot_uniform(seed=3)
    net = images
    for index, (c_in, c_out) in enumerate(((3, 8), (8, 16))):
        kernel = tf1.get_variable("conv%d/kernel" % index, [3, 3, c_in, c_out], initializer=init)
        net = tf.nn.relu(tf.nn.conv2d(net, kernel, [1, 1, 1, 1], "SAME", name="conv%d/Conv2D" % index))
    net = tf.reduce_mean(net, [1, 2], name="pool")
    kernel = tf1.get_variable("dense/kernel", [16, 10], initializer=init)
    bias = tf1.get_variable("dense/bias", [10], initializer=tf1.zeros_initializer())
    logits = tf.nn.bias_add(tf.linalg.matmul(net, kernel, name="dense/MatMul"), bias, name="logits")
    return logits, tf.nn.softmax(logits, name="probs")


def frozen_net(path: str, text: bool = False) -> str:
    """The SavedModel's network frozen with convert_variables_to_constants: images -> logits, probs."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
        _dense_net(images)
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            frozen = tf1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), ["probs", "logits"])
    return write_frozen(frozen, path, text)


def saved_model(directory: str) -> str:
    """A SavedModel (tag 'serve') with signatures 'serving_default' and 'logits_only'."""
    path = os.path.join(directory, "saved_model")
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
        logits, probs = _dense_net(images)
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            builder = tf1.saved_model.Builder(path)
            signatures = {
                "serving_default": tf1.saved_model.predict_signature_def(
                    {"images": images}, {"probs": probs, "logits": logits}),
                "logits_only": tf1.saved_model.predict_signature_def({"images": images}, {"logits": logits}),
            }
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map=signatures)
            builder.save()
    return path


def meta_graph(directory: str) -> str:
    """A MetaGraph ``model.meta`` with its checkpoint ``model.index`` / ``.data`` beside it."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
        _dense_net(images)
        saver = tf1.train.Saver()
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            prefix = saver.save(session, os.path.join(directory, "model"))
    return prefix + ".meta"


def constants_graph(big: float = 1e5, eps: float = 1e-9):
    """x -> mm (w, with a few negligible 1e-9 weights) -> scaled = mm * big -> shifted = scaled + eps.

    ``big`` overflows float16, ``eps`` alone underflows it; the 1e-9 weights next to O(1)
    ones are negligible.
    """
    graph = tf.Graph()
    weights = np.random.default_rng(1).standard_normal([8, 8]).astype(np.float32)
    weights[0, :3] = 1e-9
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        mm = tf.linalg.matmul(x, tf.constant(weights, name="w"), name="mm")
        scaled = tf.multiply(mm, tf.constant(big, name="big"), name="scaled")
        shifted = tf.add(scaled, tf.constant(eps, name="eps"), name="shifted")
        tf.identity(shifted, name="out")
    return graph.as_graph_def()


def overflow_inputs(path: str) -> str:
    """Images for ``frozen_net`` that overflow float16 (float32 copes: finite probs)."""
    np.savez(path, images=np.full([2, 8, 8, 3], 1e5, np.float32))  # > 65504: inf in float16
    return path


# -- ResNet-50 v1.5 ---------------------------------------------------------------------
_STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))
# Calibration images: random normal like the inputs of ``--validate`` (validate.py's
# ``random_inputs``), which they stand for, but drawn from a seed of their own: the tests
# validate on seeds 0-2, never on the images the statistics were estimated from.
CALIBRATION_SEED = 5050
CALIBRATION_BATCH = 32
# Scale of each residual branch's last batch norm (trained ResNet-50s: about 0.2-0.5).
# Random batch-normalised networks amplify small perturbations with depth; at 0.2 the
# half-precision error of the logits is half what it is at 0.4 (measured: 0.10 vs 0.24).
RESIDUAL_GAMMA = 0.2
# The classifier.  A trained ResNet-50's largest logits are 10-25 and its top-1 stands out
# (probability mostly 0.8-1 on what it recognises; noise images, too, go to one or a few
# classes).  A random classifier on calibrated features would rank 1000 random directions:
# its top two are often near-tied, and float16 flipped top-1 on 1-3 of 48 random images.
# So: the 999 ordinary classes' logits are centred at 0 with standard deviation LOGIT_SPREAD
# over the calibration images, and the noise class reads the features' mean direction,
# NOISE_LOGIT on average.  Measured on 160 random images: largest logit 10.7-14.7, top-1
# probability 0.79-0.93 (10th-90th percentile), runner-up a median 4 logits behind (the
# closest 0.34, which float16 moves by less than 0.01).
LOGIT_SPREAD = 2.5
NOISE_LOGIT = 12.0
NOISE_CLASS = 0


def resnet50_frozen(path: str, image_size: int = 64, classes: int = 1000) -> Dict[str, str]:
    """A frozen ResNet-50 v1.5 inference graph (25.6 M random weights) written to ``path``.

    Stride 2 sits in each stage's first 3x3 conv (v1.5); batch norm is the fused
    inference op.  Input ``images`` [None, image_size, image_size, 3], output ``probs``.
    Its statistics are those of a trained network on random-normal images, the inputs
    ``--validate`` makes (``calibrate_resnet50``): every batch norm's moving mean and
    variance are its input's over ``calibration_images``, the classifier's logits are
    of a trained network's size, and top-1 is one class with a margin.
    """
    calibration = calibrate_resnet50(calibration_images(image_size), classes)
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [None, image_size, image_size, 3], name="images")
        logits = _resnet50(images, calibration.batch_norm_initializers(), calibration.classifier)
        tf.nn.softmax(logits, name="probs")
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            frozen = tf1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), ["probs"])
    write_frozen(frozen, path)
    return {"path": path, "input": "images", "output": "probs"}


def calibration_images(image_size: int = 64) -> np.ndarray:
    """The images ``resnet50_frozen`` is calibrated on: random normal, seed ``CALIBRATION_SEED``."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    return rng.standard_normal([CALIBRATION_BATCH, image_size, image_size, 3]).astype(np.float32)


class ResNet50Calibration:
    """Batch-norm statistics (``moments``: (mean, variance) per batch norm, in build order)
    and the classifier (``classifier``: kernel, bias) of ``resnet50_frozen``."""

    def __init__(self, moments, classifier):
        self.moments, self.classifier = moments, classifier

    def batch_norm_initializers(self):
        """A ``statistics`` argument of ``_resnet50``: the moments as variable initializers."""
        remaining = list(self.moments)

        def statistics(x):
            mean, variance = remaining.pop(0)
            return tf1.constant_initializer(mean), tf1.constant_initializer(variance)
        return statistics


def calibrate_resnet50(images: np.ndarray, classes: int = 1000) -> ResNet50Calibration:
    """Batch-norm re-estimation and classifier scaling on ``images``, in one forward pass.

    Batch-norm re-estimation sets each batch norm's moving statistics to those of its input
    with every batch norm before it already re-estimated; normalising every batch norm by
    its own input's batch moments computes exactly those inputs, all in one run::

        for each batch norm, in order:  mean, variance = moments of its input over
                                        (images, height, width); normalise with them
        f = pooled features;  mu = mean of f over the images;  W = random classifier
        ordinary classes:  logits = s * (f - mu) @ W,  s: their std over the images = LOGIT_SPREAD
        noise class:       logit  = NOISE_LOGIT * (f . mu) / (mu . mu)   (NOISE_LOGIT at f = mu)

    The noise class reads the features' mean direction, as a trained classifier's weights
    for a class align with the features of its images: here every image is a noise image.
    """
    graph = tf.Graph()
    with graph.as_default():
        placeholder = tf1.placeholder(tf.float32, [None] + list(images.shape[1:]), name="images")
        moments = []

        def batch_moments(x):
            moments.append(tf.nn.moments(x, [0, 1, 2]))
            return moments[-1]
        features = _resnet50(placeholder, batch_moments, None)
        kernel = tf1.get_variable("fc/kernel", [features.shape[-1], classes],
                                  initializer=tf1.initializers.glorot_uniform(seed=2))
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            values, pooled, weights = session.run([moments, features, kernel], {placeholder: images})
    mean = pooled.mean(0)
    weights = weights * LOGIT_SPREAD / np.delete((pooled - mean) @ weights, NOISE_CLASS, 1).std()
    bias = -mean @ weights
    weights[:, NOISE_CLASS], bias[NOISE_CLASS] = NOISE_LOGIT * mean / (mean @ mean), 0.0
    return ResNet50Calibration(values, (weights.astype(np.float32), bias.astype(np.float32)))


def _resnet50(images, statistics, classifier):
    """The network up to its logits (``classifier``: (kernel, bias) values), or up to its
    pooled features (``classifier`` None); ``statistics(x)``: a batch norm's (mean, variance)
    as tensors or as variable initializers."""
    net = _batch_norm(_conv(images, 64, 7, 2, "conv1"), "bn_conv1", statistics)
    net = tf.nn.max_pool2d(net, 3, 2, "SAME")
    for stage, (filters, blocks) in enumerate(_STAGES):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            net = _bottleneck(net, filters, stride, "stage%d/block%d" % (stage + 1, block), statistics)
    net = tf.reduce_mean(net, [1, 2], name="pool")
    if classifier is None:
        return net
    kernel = tf1.get_variable("fc/kernel", initializer=classifier[0])
    bias = tf1.get_variable("fc/bias", initializer=classifier[1])
    return tf.nn.bias_add(tf.linalg.matmul(net, kernel), bias, name="logits")


def _conv(x, filters, size, stride, name):
    with tf1.variable_scope(name):
        kernel = tf1.get_variable("kernel", [size, size, x.shape[-1], filters],
                                  initializer=tf1.initializers.he_normal(seed=1))
        padding = "SAME"
        if stride > 1 and size > 1:  # fixed padding, as the reference v1.5 model
            before = (size - 1) // 2
            x = tf.pad(x, [[0, 0], [before, size - 1 - before], [before, size - 1 - before], [0, 0]])
            padding = "VALID"
        return tf.nn.conv2d(x, kernel, [1, stride, stride, 1], padding)


def _batch_norm(x, name, statistics, relu=True, scale=1.0):
    with tf1.variable_scope(name):
        channels = x.shape[-1]
        gamma = tf1.get_variable("gamma", [channels], initializer=tf1.constant_initializer(scale))
        beta = tf1.get_variable("beta", [channels], initializer=tf1.zeros_initializer())
        mean, variance = statistics(x)
        if not isinstance(mean, tf.Tensor):  # initializers: the inference graph's variables
            mean = tf1.get_variable("moving_mean", [channels], initializer=mean)
            variance = tf1.get_variable("moving_variance", [channels], initializer=variance)
        y, _, _ = tf1.nn.fused_batch_norm(x, gamma, beta, mean, variance, is_training=False)
        return tf.nn.relu(y) if relu else y


def _bottleneck(x, filters, stride, name, statistics):
    with tf1.variable_scope(name):
        shortcut = x
        if stride != 1 or x.shape[-1] != 4 * filters:
            shortcut = _conv(x, 4 * filters, 1, stride, "projection")
            shortcut = _batch_norm(shortcut, "projection_bn", statistics, relu=False)
        y = _batch_norm(_conv(x, filters, 1, 1, "conv1"), "bn1", statistics)
        y = _batch_norm(_conv(y, filters, 3, stride, "conv2"), "bn2", statistics)
        y = _batch_norm(_conv(y, 4 * filters, 1, 1, "conv3"), "bn3", statistics, relu=False,
                        scale=RESIDUAL_GAMMA)
        return tf.nn.relu(y + shortcut)

"""The ResNet-50 example's inference graph (examples/resnet50/model.py), frozen with seeded weights.

``resnet50_inference(path)`` builds ResNet-50 v1.5 as the example does (NHWC,
``tf.compat.v1.layers``, fused batch norm in inference mode), gives every variable a
seeded value -- He-normal kernels and batch-norm statistics that keep the activations
O(1), the residual branches' last scale 0.2-0.5 as trained networks have it -- and writes
the frozen GraphDef. Same file on every run.
"""
from __future__ import annotations

import sys
import zlib
from typing import Dict

import numpy as np
import tensorflow as tf
from repo_paths import EXAMPLES

if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)
from resnet50 import model  # noqa: E402

tf1 = tf.compat.v1

INPUT = "images"
LOGITS = "resnet50_v1.5/logits/BiasAdd"
PROBS = "probs"


def _value(name: str, shape):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if name.endswith("kernel"):
        fan_in = int(np.prod(shape[:-1]))
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
    if name.endswith("gamma"):
        return rng.uniform(0.2, 0.5, shape) if "/conv3/" in name else rng.uniform(0.8, 1.2, shape)
    if name.endswith(("beta", "moving_mean", "bias")):
        return rng.normal(0.0, 0.1, shape)
    if name.endswith("moving_variance"):
        return rng.uniform(0.8, 1.2, shape)
    raise ValueError("no value rule for variable %s" % name)


def resnet50_inference(path: str, image_size: int = 64, classes: int = 1000) -> Dict[str, str]:
    """Writes the frozen graph to ``path``; returns its input and output node names."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [None, image_size, image_size, 3], name=INPUT)
        logits = model.resnet_v15(images, classes, training=False)
        tf.nn.softmax(logits, name=PROBS)
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            for variable in tf1.global_variables():
                name = variable.op.name
                variable.load(_value(name, variable.shape.as_list()).astype(np.float32), session)
            frozen = tf1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), [PROBS])
    with open(path, "wb") as handle:
        handle.write(frozen.SerializeToString())
    return {"path": path, "input": INPUT, "logits": LOGITS, "probs": PROBS}

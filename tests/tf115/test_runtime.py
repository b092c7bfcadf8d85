"""TensorFlow 1.15's own runtime loads through its C API and computes what numpy computes."""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfamp_rewrite.graph_rewrite.forward_compat import strip_default_attrs
from tfamp_rewrite.graph_rewrite.rewrite import op_def_lookup

tf1 = tf.compat.v1


def affine_relu():
    """x @ w + 0.25, relu; default-valued attributes left out, as TensorFlow 1.15 must read
    it (newer TensorFlow adds some, e.g. 2.21's MatMul grad_a / grad_b)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.constant([[1.0, -2.0], [0.5, 1.0], [-1.0, 3.0]], name="w")
        tf.nn.relu(tf.matmul(x, w) + 0.25, name="y")
    graph_def = graph.as_graph_def()
    strip_default_attrs(graph_def, op_def_lookup(graph_def))
    return graph_def


def test_tf115_runtime_loads_and_runs_a_graph(tf115, tf2, verified):
    version = tf115.version()
    assert version.startswith("1.15."), version
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]], np.float32)
    graph_def = affine_relu()
    (y,) = tf115.run(graph_def.SerializeToString(), {"x:0": x}, ["y:0"])
    w = np.array([[1.0, -2.0], [0.5, 1.0], [-1.0, 3.0]], np.float32)
    np.testing.assert_allclose(y, np.maximum(x @ w + 0.25, 0), rtol=1e-6)
    written = graph_pb2.GraphDef.FromString(tf115.export_graph_def(graph_def.SerializeToString()))
    assert 0 < written.versions.producer < graph_def.versions.producer  # 1.15's GraphDef version
    verified("TensorFlow 1.15 runtime", "TF_Version() = %s: TensorFlow 1.15's C API "
             "(libtensorflow_framework.so.1, _pywrap_tensorflow_internal.so) loaded through ctypes; "
             "its GraphDef producer version %d; references from TensorFlow %s"
             % (version, written.versions.producer, tf2.version()))

"""The requests ``tf115_capi.Tf115Runtime`` answers, answered by this Python's TensorFlow 2.x.

Runs in a child process of its own (``runtime_process.tf2_process``), started with
``TF_ENABLE_ONEDNN_OPTS=0``: TensorFlow 1.15 has no oneDNN kernels, so both runtimes then
compute float32 MatMul and Conv2D with Eigen, and graphs whose half precision is emulated
with float32 kernels and Casts give the same values in both.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2

tf1 = tf.compat.v1


class Tf2Runtime:
    """This process's TensorFlow, through ``tf.compat.v1.Session``."""

    errors = (tf.errors.OpError, ValueError)  # what a refused call raises

    def version(self) -> str:
        return tf.__version__

    def run(self, graph_def: bytes, feeds: Dict[str, object], fetches: Sequence[str],
            targets: Sequence[str] = (), config: bytes = b"") -> List[np.ndarray]:
        """Imports ``graph_def`` into a new graph and session, runs ``targets`` and ``fetches``."""
        return self.run_steps(graph_def, [(feeds, fetches, targets)], config)[0]

    def run_steps(self, graph_def: bytes, steps, config: bytes = b"") -> List[List[np.ndarray]]:
        """Several ``(feeds, fetches, targets)`` runs in one session, in order."""
        graph = tf.Graph()
        with graph.as_default():
            tf1.import_graph_def(graph_pb2.GraphDef.FromString(graph_def), name="")
        results = []
        with tf1.Session(graph=graph, config=config_pb2.ConfigProto.FromString(config)) as session:
            for feeds, fetches, targets in steps:
                values = session.run(list(fetches) + list(targets), dict(feeds))
                results.append([np.asarray(value) for value in values[:len(fetches)]])
        return results

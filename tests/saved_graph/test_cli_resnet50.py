"""A frozen ResNet-50 v1.5 converts: every Conv2D/MatMul in half, top-1 agrees, half the bytes.

The ResNet-50 is a calibrated stand-in for a trained one (saved_graph_models.resnet50_frozen):
the last test checks that it is.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import saved_graph_models as models
import tensorflow as tf
from cli_helpers import HALF, node_types, read_graph, run_main

from tfamp_rewrite.saved_graph.graph_io import GraphTensor
from tfamp_rewrite.saved_graph.validate import random_inputs


@pytest.fixture(scope="module")
def resnet50(tmp_path_factory):
    directory = tmp_path_factory.mktemp("resnet50")
    return models.resnet50_frozen(str(directory / "resnet50.pb"))


def test_resnet50_frozen_graph_converts_to_half(resnet50, tmp_path, capsys):
    output, report_path = tmp_path / "resnet50_fp16.pb", tmp_path / "report.json"
    code, out, err = run_main(capsys, "convert", resnet50["path"], str(output), "--validate",
                              "--batch-size", "8", "--report", str(report_path))
    assert code == 0, err + out
    types = node_types(read_graph(str(output)))
    tensor_core_ops = {name: dtype for name, (op, dtype) in types.items() if op in ("Conv2D", "MatMul")}
    assert len(tensor_core_ops) == 54  # 53 convolutions and the classifier
    assert set(tensor_core_ops.values()) == {HALF}
    assert os.path.getsize(output) <= 0.6 * os.path.getsize(resnet50["path"])
    report = json.loads(report_path.read_text())
    validation = report["validation"]
    assert (validation["rtol"], validation["atol"]) == (1e-2, 1e-2)  # float16, emulated
    assert validation["numerics"] == "emulate"  # no GPU: Tensor Core numerics, the same on any CPU
    (probs,) = validation["outputs"]
    assert probs["top1_agreement"] == 1.0 and probs["nonfinite"] == 0
    assert probs["max_abs_error"] <= 1e-2  # 0.0012 here
    tensor_cores = report["rewrite"]["tensor_cores"]
    assert tensor_cores["half_flop_share"] == 1.0
    misaligned = [op for op in tensor_cores["ops"] if op["aligned"] is False]
    assert [(op["name"], op["fix"]) for op in misaligned] == [("conv1/Conv2D", "pad C_in 3 -> 8")]
    half_constants = [name for name, (op, dtype) in types.items() if op == "Const" and dtype == HALF]
    assert len(half_constants) == report["constants"]["folded"] == 55  # 54 kernels, the classifier's bias


def test_resnet50_stand_in_is_calibrated_like_a_trained_network(resnet50):
    """Every batch norm normalises its input on the calibration images, and on the inputs
    ``--validate`` makes the logits are of a trained network's size with a clear top-1.
    Uncalibrated (moving mean 0, variance 1) the same network's batch-norm outputs have means
    up to 215 and its logits reach +-230."""
    graph_def = read_graph(resnet50["path"])
    batch_norms = [node for node in graph_def.node if node.op.startswith("FusedBatchNorm")]
    assert len(batch_norms) == 53
    calibration = models.calibration_images()
    images = random_inputs([GraphTensor("images", "images:0", "float32", shape=[None, 64, 64, 3])], 8, 0)[0]
    assert not (images[:, None] == calibration[None]).all((2, 3, 4)).any()  # other images
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            outputs = session.run([[node.name + ":0", node.input[1] + ":0", node.input[2] + ":0"]
                                   for node in batch_norms], {"images:0": calibration})
            logits = session.run("logits:0", {"images:0": images})
    for node, (y, gamma, beta) in zip(batch_norms, outputs):
        normalised = (y - beta) / gamma  # (x - moving mean) / sqrt(moving variance + epsilon)
        assert np.abs(normalised.mean((0, 1, 2))).max() < 1e-3, node.name
        assert np.abs(normalised.std((0, 1, 2)) - 1).max() < 1e-2, node.name
    top2 = np.sort(logits, -1)[:, -2:]
    assert 10 <= logits.max(-1).min() and logits.max() <= 25  # largest logit: 11-13 here
    assert (top2[:, 1] - top2[:, 0]).min() >= 1  # 2.1 here; half moves logits by <= 0.11

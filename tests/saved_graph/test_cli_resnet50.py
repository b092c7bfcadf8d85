"""A frozen ResNet-50 v1.5 converts: every Conv2D/MatMul in half, top-1 agrees, half the bytes."""
from __future__ import annotations

import json
import os

import pytest
import saved_graph_models as models
from cli_helpers import HALF, node_types, read_graph, run_main


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
    assert (validation["rtol"], validation["atol"]) == (2e-2, 2e-2)  # float16, emulated
    assert validation["numerics"] == "emulate"  # no GPU: Tensor Core numerics, the same on any CPU
    (probs,) = validation["outputs"]
    assert probs["top1_agreement"] == 1.0 and probs["nonfinite"] == 0
    assert probs["max_abs_error"] <= 2e-2
    tensor_cores = report["rewrite"]["tensor_cores"]
    assert tensor_cores["half_flop_share"] == 1.0
    misaligned = [op for op in tensor_cores["ops"] if op["aligned"] is False]
    assert [(op["name"], op["fix"]) for op in misaligned] == [("conv1/Conv2D", "pad C_in 3 -> 8")]
    half_constants = [name for name, (op, dtype) in types.items() if op == "Const" and dtype == HALF]
    assert len(half_constants) == report["constants"]["folded"] == 55  # 54 kernels, the classifier's bias

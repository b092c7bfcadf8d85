"""Every saved-graph format converts through the installed command line and loads back with
TensorFlow's own loaders; keep-io-types decides the dtypes at the boundary."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import saved_graph_models as models
import tensorflow as tf
from cli_helpers import FLOAT, HALF, node_types, random_images, read_graph, run_cli, run_graph, run_main
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import saved_model_pb2

tf1 = tf.compat.v1
TENSOR_CORE_OPS = ("Conv2D", "MatMul")


def _assert_tensor_core_ops_half(graph_def):
    ops = [(name, dtype) for name, (op, dtype) in node_types(graph_def).items() if op in TENSOR_CORE_OPS]
    assert len(ops) == 3
    assert all(dtype == HALF for _, dtype in ops), ops


def test_frozen_pb_converts_through_the_console_script(tmp_path):
    source = models.frozen_net(str(tmp_path / "net.pb"))
    output, report = tmp_path / "net_fp16.pb", tmp_path / "report.json"
    result = run_cli("convert", source, str(output), "--report", str(report))
    assert result.returncode == 0, result.stderr
    assert "wrote %s" % output in result.stdout
    converted, original = read_graph(str(output)), read_graph(source)
    _assert_tensor_core_ops_half(converted)
    types = node_types(converted)
    assert types["images"] == ("Placeholder", FLOAT)  # keep-io-types: boundary stays float32
    assert types["probs"][1] == FLOAT  # the default output: the node nothing consumes
    assert types["logits"][1] == HALF  # consumed by probs, so not an output here
    assert types["conv0/kernel"] == ("Const", HALF)  # weights stored in half
    images = random_images()
    expected = run_graph(original, ["probs:0"], {"images:0": images})[0]
    actual = run_graph(converted, ["probs:0"], {"images:0": images})[0]
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, atol=2e-2)
    data = json.loads(report.read_text())
    assert data["output"] == str(output) and data["rewrite"]["nodes_converted"] > 0


def test_frozen_pbtxt_converts_with_python_m(tmp_path):
    source = models.frozen_net(str(tmp_path / "net.pbtxt"), text=True)
    output = tmp_path / "net_fp16.pbtxt"
    result = run_cli("convert", source, str(output), "--dtype", "bfloat16", "--target", "cpu", module=True)
    assert result.returncode == 0, result.stderr
    converted = text_format.Parse(output.read_text(), graph_pb2.GraphDef())
    bf16 = tf.bfloat16.as_datatype_enum
    assert {dtype for name, (op, dtype) in node_types(converted).items() if op in TENSOR_CORE_OPS} == {bf16}
    np.testing.assert_allclose(
        run_graph(converted, ["probs:0"], {"images:0": random_images()})[0],
        run_graph(text_format.Parse(open(source).read(), graph_pb2.GraphDef()), ["probs:0"],
                  {"images:0": random_images()})[0], atol=5e-2)


def test_meta_graph_converts_and_restores_its_checkpoint(tmp_path):
    source = models.meta_graph(str(tmp_path))
    output = tmp_path / "converted.meta"
    result = run_cli("convert", source, str(output), "--outputs", "probs", "--validate")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "Validation on random inputs" in result.stdout and "passed" in result.stdout
    prefix = source[: -len(".meta")]
    outputs = []
    for meta in (source, str(output)):
        graph = tf.Graph()
        with graph.as_default(), tf1.Session(graph=graph) as session:
            tf1.train.import_meta_graph(meta).restore(session, prefix)  # variables stay float32
            if meta == str(output):
                assert graph.get_operation_by_name("conv1/Conv2D").get_attr("T") == tf.float16
            outputs.append(session.run("probs:0", {"images:0": random_images()}))
    np.testing.assert_allclose(outputs[1], outputs[0], atol=2e-2)


def test_saved_model_round_trip_serves_the_same_signatures(tmp_path):
    source = models.saved_model(str(tmp_path))
    output = tmp_path / "converted"
    result = run_cli("convert", source, str(output), "--signature-def", "serving_default")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(output)) == sorted(os.listdir(source))
    served = {}
    for path in (source, str(output)):
        graph = tf.Graph()
        with graph.as_default(), tf1.Session(graph=graph) as session:
            meta = tf1.saved_model.loader.load(session, ["serve"], path)
            signatures = {key: ({k: (v.name, v.dtype) for k, v in sig.inputs.items()},
                                {k: (v.name, v.dtype) for k, v in sig.outputs.items()})
                          for key, sig in meta.signature_def.items()}
            default = meta.signature_def["serving_default"]
            values = session.run({key: info.name for key, info in default.outputs.items()},
                                 {default.inputs["images"].name: random_images()})
            half_convs = [op.name for op in graph.get_operations()
                          if op.type == "Conv2D" and op.get_attr("T") == tf.float16]
            served[path] = (signatures, values, half_convs)
    (sig_before, before, _), (sig_after, after, half_convs) = served[source], served[str(output)]
    assert sig_after == sig_before  # same keys, tensors and dtypes (float32)
    assert half_convs == ["conv0/Conv2D", "conv1/Conv2D"]
    for key in before:
        assert after[key].dtype == before[key].dtype == np.float32
        np.testing.assert_allclose(after[key], before[key], atol=5e-2)


def _read_saved_model(directory: str):
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(directory, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    return saved


def test_compat_tf115_saved_model_leaves_defaults_out_and_says_so(tmp_path, capsys):
    """What TensorFlow 1.15 reads (tests/tf115 runs it there); TF 2.x loaders fill defaults in."""
    source = models.saved_model(str(tmp_path))
    output = tmp_path / "converted"
    code, out, err = run_main(capsys, "convert", source, str(output), "--compat", "tf1.15",
                              "--target", "cpu", "--validate")
    assert code == 0, err + out
    (meta,) = _read_saved_model(str(output)).meta_graphs
    assert meta.meta_info_def.stripped_default_attrs
    (before,) = _read_saved_model(source).meta_graphs
    assert not before.meta_info_def.stripped_default_attrs
    # a default-valued attribute of the variables: resource (TF2 behaviour) or ref (TF1)
    defaulted = {"VarHandleOp": "allowed_devices", "VariableV2": "container"}
    variables = [node for node in meta.graph_def.node if node.op in defaulted]
    assert variables and not any(defaulted[node.op] in node.attr for node in variables)
    assert all(defaulted[node.op] in node.attr for node in before.graph_def.node if node.op in defaulted)


@pytest.mark.parametrize("fmt", ["saved_model", "frozen"])
def test_no_keep_io_types_makes_the_boundary_half(fmt, tmp_path, capsys):
    source = models.saved_model(str(tmp_path)) if fmt == "saved_model" else models.frozen_net(
        str(tmp_path / "net.pb"))
    output = str(tmp_path / ("converted" if fmt == "saved_model" else "converted.pb"))
    names = [] if fmt == "saved_model" else ["--outputs", "probs,logits"]
    code, out, err = run_main(capsys, "convert", source, output, "--no-keep-io-types", "--report",
                              str(tmp_path / "r.json"), *names)
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert {t["key"]: t["converted_dtype"] for t in report["inputs"]} == {"images": "float16"}
    assert {t["key"]: t["converted_dtype"] for t in report["outputs"]} == {"logits": "float16",
                                                                           "probs": "float16"}
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as session:
        if fmt == "saved_model":
            meta = tf1.saved_model.loader.load(session, ["serve"], output)
            signature = meta.signature_def["serving_default"]
            assert signature.inputs["images"].dtype == HALF
            assert signature.outputs["probs"].dtype == HALF
        else:
            tf1.import_graph_def(read_graph(output), name="")
        assert graph.get_tensor_by_name("images:0").dtype == tf.float16
        probs = session.run("probs:0", {"images:0": random_images().astype(np.float16)})
    assert probs.dtype == np.float16
    assert not [op for op in graph.get_operations() if op.name.startswith("images-0-Cast")]


def test_keep_io_types_is_the_default(tmp_path, capsys):
    source = models.saved_model(str(tmp_path))
    code, out, _ = run_main(capsys, "convert", source, str(tmp_path / "converted"))
    assert code == 0
    assert "input  images                           float32 -> float32" in out
    assert "output probs                            float32 -> float32" in out


@pytest.mark.tf2_behavior("tf.saved_model.save of a tf.Module with a tf.function")
def test_tf2_saved_model_converts_its_function_bodies(tmp_path, capsys):
    """tf.saved_model.save: the math lives in functions; the init signature names a NoOp."""

    class Dense(tf.Module):
        def __init__(self):
            super().__init__()
            self.kernel = tf.Variable(np.random.default_rng(0).random([16, 8], np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
        def __call__(self, x):
            return {"y": tf.nn.softmax(tf.linalg.matmul(x, self.kernel))}

    module = Dense()
    tf.saved_model.save(module, str(tmp_path / "tf2"), signatures=module.__call__)
    report = tmp_path / "r.json"
    code, _, err = run_main(capsys, "convert", str(tmp_path / "tf2"), str(tmp_path / "out"), "--validate",
                            "--report", str(report))
    assert code == 0, err
    data = json.loads(report.read_text())
    converted = [f for f in data["rewrite"]["functions"] if f["report"] and f["report"]["nodes_converted"]]
    assert converted and converted[0]["report"]["op_counts"]["MatMul"] == {"total": 1, "converted": 1}
    outputs = [(t["key"], t["dtype"], t["converted_dtype"]) for t in data["outputs"]]
    assert outputs == [("y", "float32", "float32")]
    assert data["validation"]["passed"]

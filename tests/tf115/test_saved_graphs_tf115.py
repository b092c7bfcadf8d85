"""Graphs converted by ``tfamp-rewrite convert`` run in TensorFlow 1.15 and compute what 2.x does.

Formats: a frozen ``.pb``, a MetaGraph and a SavedModel (their variables restored from the
checkpoint through the Saver's restore op, as 1.15's loaders do), and the ResNet-50
example's inference graph. Inputs are graphs as TensorFlow 1.15 writes them (converted
with the defaults) and graphs TensorFlow 2.x wrote (converted with ``--compat tf1.15``,
which must leave out what 1.15 rejects). Every graph runs in 1.15 and in 2.x, each in a
child process with Grappler off; tolerances: tests/support/tf115_compare.py.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import saved_graph_models as models
from graph_runner import plain_config
from resnet50_inference import resnet50_inference
from runtime_process import RuntimeFailure
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tf115_compare import forward_bound, relative_difference
from tf115_graphs import op_attrs, written_by_tf115

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.saved_graph.cli import main

CONFIG = plain_config().SerializeToString()
HALF = 19  # DT_HALF


@pytest.fixture(scope="module")
def known_attrs(tf115):
    return op_attrs(tf115.all_op_list())


def read(path, message_type):
    with open(str(path), "rb") as handle:
        return message_type.FromString(handle.read())


def write(path, message) -> str:
    with open(str(path), "wb") as handle:
        handle.write(message.SerializeToString())
    return str(path)


def convert(capsys, source, output, *options) -> str:
    capsys.readouterr()
    code = main(["convert", str(source), str(output), "--target", "cpu", "-q", *options])
    assert code == 0, capsys.readouterr()
    return str(output)


def half_convolutions(graph_def) -> int:
    return sum(1 for node in graph_def.node if node.op == "Conv2D" and node.attr["T"].type == HALF)


def run_both(tf115, tf2, graph_def, feeds, fetches, restore=None):
    """``(outputs in 1.15, outputs in 2.x)``; ``restore``: ``(saver_def, checkpoint prefix)``."""
    steps = [(feeds, fetches, [])]
    if restore is not None:
        saver, prefix = restore
        steps.insert(0, ({saver.filename_tensor_name: prefix.encode()}, [], [saver.restore_op_name]))
    data = graph_def.SerializeToString()
    return (tf115.run_steps(data, steps, CONFIG)[-1], tf2.run_steps(data, steps, CONFIG)[-1])


def compare(label, graph_def, numerics, outputs):
    """Asserts that ``outputs`` (1.15's, 2.x's) agree; returns a line saying how closely."""
    differences = [relative_difference(a, b) for a, b in zip(*outputs)]
    assert max(differences) <= forward_bound(graph_def, numerics), (label, differences)
    return "%s %.1e" % (label, max(differences))


def compared(label, tf115, tf2, graph_def, numerics, feeds, fetches, restore=None):
    return compare(label, graph_def, numerics, run_both(tf115, tf2, graph_def, feeds, fetches, restore))


# -- ResNet-50 --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet50(tmp_path_factory, tf115, known_attrs):
    """The example's frozen inference graph as 2.x writes it, and as 1.15 writes it."""
    directory = tmp_path_factory.mktemp("resnet50")
    net = resnet50_inference(str(directory / "resnet50_tf2.pb"))
    written = written_by_tf115(read(net["path"], graph_pb2.GraphDef), tf115, known_attrs)
    net["path_tf115"] = write(directory / "resnet50_tf115.pb", written)
    net["feeds"] = {"images:0": np.random.default_rng(7).standard_normal([2, 64, 64, 3]).astype(np.float32)}
    net["fetches"] = [net["logits"] + ":0", net["probs"] + ":0"]
    return net


def test_resnet50_written_by_tf2_converted_with_compat_tf115_runs_in_tf115(
        resnet50, tf115, tf2, tmp_path, capsys, verified):
    feeds, fetches = resnet50["feeds"], resnet50["fetches"]
    latest = read(convert(capsys, resnet50["path"], tmp_path / "latest.pb"), graph_pb2.GraphDef)
    with pytest.raises(RuntimeFailure, match="exponential_avg_factor"):  # what compat tf1.15 is for
        tf115.run(latest.SerializeToString(), feeds, fetches, config=CONFIG)
    converted = read(convert(capsys, resnet50["path"], tmp_path / "tf115.pb", "--compat", "tf1.15"),
                     graph_pb2.GraphDef)
    assert half_convolutions(converted) == 53
    outputs = run_both(tf115, tf2, converted, feeds, fetches)
    assert np.array_equal(outputs[0][0].argmax(1), outputs[1][0].argmax(1))
    verified("graphs converted by tfamp-rewrite", "--compat tf1.15 of the ResNet-50 example's frozen "
             "graph as TF 2.x writes it (53 half Conv2D): runs in TF 1.15; max rel. difference to TF 2.x: "
             + compare("native half", converted, "native", outputs) + " (with the defaults, 1.15 rejects it: "
             "FusedBatchNormV3.exponential_avg_factor)")


def test_resnet50_written_by_tf115_converts_and_runs_in_tf115(resnet50, tf115, tf2, tmp_path, capsys,
                                                              verified):
    feeds, fetches = resnet50["feeds"], resnet50["fetches"]
    source = read(resnet50["path_tf115"], graph_pb2.GraphDef)
    converted = read(convert(capsys, resnet50["path_tf115"], tmp_path / "converted.pb"), graph_pb2.GraphDef)
    emulated = rewrite_graph_def(source, fetches=[resnet50["probs"]], feeds=[resnet50["input"]],
                                 target="cpu", numerics="emulate").graph_def
    lines = [compared("float32", tf115, tf2, source, "float32", feeds, fetches),
             compared("converted, native half", tf115, tf2, converted, "native", feeds, fetches),
             compared("emulated", tf115, tf2, emulated, "emulate", feeds, fetches)]
    verified("graphs converted by tfamp-rewrite", "ResNet-50 example's frozen graph as TF 1.15 writes "
             "it, converted with the defaults: runs in TF 1.15; max rel. difference to TF 2.x: "
             + "; ".join(lines))


# -- frozen .pb, MetaGraph, SavedModel ----------------------------------------------------

IMAGES = {"images:0": np.random.default_rng(3).standard_normal([4, 8, 8, 3]).astype(np.float32)}
OUTPUTS = ["logits:0", "probs:0"]


def test_frozen_graph_converts_for_tf115_from_either_writer(tf115, tf2, known_attrs, tmp_path, capsys,
                                                           verified):
    tf2_written = models.frozen_net(str(tmp_path / "net.pb"))
    tf115_written = write(tmp_path / "net_tf115.pb", written_by_tf115(
        read(tf2_written, graph_pb2.GraphDef), tf115, known_attrs))
    lines = []
    for label, source, options in (("TF 2.x's, --compat tf1.15", tf2_written, ["--compat", "tf1.15"]),
                                   ("TF 1.15's, defaults", tf115_written, [])):
        output = read(convert(capsys, source, tmp_path / ("converted%d.pb" % len(lines)), *options),
                      graph_pb2.GraphDef)
        assert half_convolutions(output) == 2
        lines.append(compared(label, tf115, tf2, output, "native", IMAGES, OUTPUTS))
    verified("graphs converted by tfamp-rewrite", "frozen .pb: runs in TF 1.15; max rel. difference "
             "to TF 2.x: " + "; ".join(lines))


def test_meta_graph_converts_and_restores_its_checkpoint_in_tf115(tf115, tf2, known_attrs, tmp_path,
                                                                  capsys, verified):
    meta = read(models.meta_graph(str(tmp_path)), meta_graph_pb2.MetaGraphDef)
    meta.graph_def.CopyFrom(written_by_tf115(meta.graph_def, tf115, known_attrs))
    (tmp_path / "tf115").mkdir()
    source = write(tmp_path / "tf115" / "model.meta", meta)
    converted = read(convert(capsys, source, tmp_path / "converted.meta", "--outputs", "probs,logits"),
                     meta_graph_pb2.MetaGraphDef)
    assert half_convolutions(converted.graph_def) == 2
    restore = (meta.saver_def, str(tmp_path / "model"))
    lines = [compared("float32", tf115, tf2, meta.graph_def, "float32", IMAGES, OUTPUTS, restore),
             compared("converted", tf115, tf2, converted.graph_def, "native", IMAGES, OUTPUTS, restore)]
    verified("graphs converted by tfamp-rewrite", "MetaGraph as TF 1.15 writes it, variables restored by its "
             "Saver in TF 1.15; max rel. difference to TF 2.x: " + "; ".join(lines))


def test_meta_graph_tf2_wrote_converts_with_compat_tf115_and_restores_in_tf115(tf115, tf2, tmp_path,
                                                                              capsys, verified):
    """TF 2.x writes resource variables with a ``debug_name`` 1.15's VarHandleOp lacks."""
    source = models.meta_graph(str(tmp_path))
    meta = read(source, meta_graph_pb2.MetaGraphDef)
    assert any(node.attr["debug_name"].s for node in meta.graph_def.node if node.op == "VarHandleOp")
    restore = (meta.saver_def, str(tmp_path / "model"))
    with pytest.raises(RuntimeFailure, match="not in Op<name=VarHandleOp"):  # what compat tf1.15 is for
        run_both(tf115, tf2, meta.graph_def, IMAGES, OUTPUTS, restore)
    converted = read(convert(capsys, source, tmp_path / "converted.meta", "--outputs", "probs,logits",
                             "--compat", "tf1.15"), meta_graph_pb2.MetaGraphDef)
    assert half_convolutions(converted.graph_def) == 2
    line = compared("converted", tf115, tf2, converted.graph_def, "native", IMAGES, OUTPUTS, restore)
    verified("graphs converted by tfamp-rewrite", "MetaGraph as TF 2.x writes it (resource variables), "
             "converted with --compat tf1.15, variables restored by its Saver in TF 1.15; max rel. "
             "difference to TF 2.x: " + line)


def test_saved_model_converts_and_restores_its_variables_in_tf115(tf115, tf2, known_attrs, tmp_path,
                                                                  capsys, verified):
    original = models.saved_model(str(tmp_path / "tf2"))
    source = str(tmp_path / "tf115")
    shutil.copytree(original, source)
    saved = read(os.path.join(source, "saved_model.pb"), saved_model_pb2.SavedModel)
    (meta,) = saved.meta_graphs
    meta.graph_def.CopyFrom(written_by_tf115(meta.graph_def, tf115, known_attrs))
    write(os.path.join(source, "saved_model.pb"), saved)
    output = convert(capsys, source, tmp_path / "converted")
    (converted,) = read(os.path.join(output, "saved_model.pb"), saved_model_pb2.SavedModel).meta_graphs
    assert half_convolutions(converted.graph_def) == 2
    signature = converted.signature_def["serving_default"]
    feeds = {signature.inputs["images"].name: IMAGES["images:0"]}
    fetches = [signature.outputs[key].name for key in ("logits", "probs")]
    restore = (converted.saver_def, os.path.join(output, "variables", "variables"))
    lines = [compared("float32", tf115, tf2, meta.graph_def, "float32", feeds, fetches, restore),
             compared("converted", tf115, tf2, converted.graph_def, "native", feeds, fetches, restore)]
    verified("graphs converted by tfamp-rewrite", "SavedModel as TF 1.15 writes it, variables restored from "
             "variables/ in TF 1.15; max rel. difference to TF 2.x: " + "; ".join(lines))

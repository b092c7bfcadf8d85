"""Tensor Core diagnostics: FLOPs from static shapes, the share in half, multiple-of-8 padding."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.graph_rewrite.tensor_cores import diagnose

tf1 = tf.compat.v1


def _diagnose(graph_def, outputs, **options):
    result = rewrite_graph_def(graph_def, fetches=outputs, **options)
    return diagnose(graph_def, result.report)


def _ops(report):
    return {op.name: op for op in report.ops}


def _dims(op):
    return {d.name: (d.size, d.padded) for d in op.dims}


def _model():
    """mm: [?,16]x[16,12]; bmm: [2,4,24]x[2,40,24]^T; conv: [1,10,10,3] * [3,3,3,16]; dw: depthwise."""
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        weights = tf.constant(rng.random([16, 12], np.float32))
        tf.identity(tf.linalg.matmul(x, weights, name="mm"), name="out_mm")
        a = tf1.placeholder(tf.float32, [2, 4, 24], name="a")
        b = tf.constant(rng.random([2, 40, 24], np.float32))
        tf.identity(tf.linalg.matmul(a, b, adjoint_b=True, name="bmm"), name="out_bmm")
        image = tf1.placeholder(tf.float32, [1, 10, 10, 3], name="image")
        conv = tf.nn.conv2d(image, tf.constant(rng.random([3, 3, 3, 16], np.float32)), 1, "SAME", name="conv")
        depthwise = tf.nn.depthwise_conv2d(conv, tf.constant(rng.random([3, 3, 16, 1], np.float32)),
                                           [1, 1, 1, 1], "SAME", name="dw")
        tf.identity(depthwise, name="out_conv")
    return graph.as_graph_def()


OUTPUTS = ["out_mm", "out_bmm", "out_conv"]
FLOPS = {"mm": 2 * 12 * 16, "bmm": 2 * 2 * 4 * 40 * 24, "conv": 2 * 10 * 10 * 16 * 3 * 3 * 3,
         "dw": 2 * 10 * 10 * 16 * 3 * 3}


def test_flops_and_dimensions_from_static_shapes():
    report = _diagnose(_model(), OUTPUTS)
    ops = _ops(report)
    assert {name: op.flops for name, op in ops.items()} == FLOPS
    assert _dims(ops["mm"]) == {"M": (None, None), "N": (12, 16), "K": (16, None)}
    assert _dims(ops["bmm"]) == {"M": (4, 8), "N": (40, None), "K": (24, None)}
    assert _dims(ops["conv"]) == {"C_in": (3, 8), "C_out": (16, None)}
    assert ops["dw"].dims == [] and ops["dw"].aligned is None  # no Tensor Core kernel to miss
    assert ops["conv"].fix == "pad C_in 3 -> 8" and ops["bmm"].fix == "pad M 4 -> 8"
    assert report.per_example  # mm's unknown batch counted as 1
    assert report.shape_source == "TensorFlow shape inference"


def test_half_share_counts_only_converted_flops():
    report = _diagnose(_model(), OUTPUTS, nodes_to_exclude=["conv"], op_types_to_exclude=["BatchMatMulV2"])
    ops = _ops(report)
    assert not ops["conv"].half and not ops["bmm"].half and ops["mm"].half and ops["dw"].half
    assert report.total_flops == sum(FLOPS.values())
    assert report.half_flops == FLOPS["mm"] + FLOPS["dw"]
    assert report.half_flop_share == pytest.approx((FLOPS["mm"] + FLOPS["dw"]) / sum(FLOPS.values()))
    assert [op.name for op in report.misaligned()] == ["mm"]  # conv and bmm run in float32
    lines = "\n".join(report.summary_lines())
    assert "2 MatMul/Conv op(s) stay float32" in lines and "excluded by name" in lines
    assert "pad N 12 -> 16" in lines


def test_backprop_convolutions_count_the_forward_flops():
    graph = tf.Graph()
    with graph.as_default():
        image = tf1.placeholder(tf.float32, [2, 12, 12, 8], name="image")
        kernel = tf1.placeholder(tf.float32, [3, 3, 8, 24], name="kernel")
        conv = tf.nn.conv2d(image, kernel, 2, "SAME", name="conv")
        grads = tf.gradients(tf.reduce_sum(conv), [image, kernel])
        for index, grad in enumerate(grads):
            tf.identity(grad, name="grad%d" % index)
    report = _diagnose(graph.as_graph_def(), ["grad0", "grad1"])
    forward = 2 * 2 * 6 * 6 * 24 * 3 * 3 * 8
    assert sorted((op.op, op.flops) for op in report.ops) == [
        ("Conv2D", forward), ("Conv2DBackpropFilter", forward), ("Conv2DBackpropInput", forward)]
    assert all(op.aligned for op in report.ops)  # 8 and 24 channels


def _matmul_with_output_shapes(rows: int, k: int, n: int):
    """x[rows, k] x ones[k, n] -> out, with ``_output_shapes`` attributes."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [rows, k], name="x")
        tf.identity(tf.linalg.matmul(x, tf.constant(np.ones([k, n], np.float32)), name="mm"), name="out")
    return graph.as_graph_def(add_shapes=True)


def test_output_shapes_attributes_fill_what_inference_cannot():
    graph_def = _matmul_with_output_shapes(2, 20, 8)
    placeholder = next(node for node in graph_def.node if node.name == "x")
    placeholder.attr["shape"].shape.unknown_rank = True  # inference now knows nothing of x
    del placeholder.attr["shape"].shape.dim[:]
    report = _diagnose(graph_def, ["out"])
    assert _dims(report.ops[0]) == {"M": (2, 8), "N": (8, None), "K": (20, 24)}
    assert report.ops[0].flops == 2 * 2 * 8 * 20


def test_shapes_fall_back_to_attributes_when_the_graph_cannot_be_imported():
    graph_def = _matmul_with_output_shapes(4, 16, 32)
    custom = graph_def.node.add(name="custom", op="MyCustomOp")  # unknown to this TensorFlow
    custom.input.append("out")
    report = _diagnose(graph_def, ["custom"])
    assert report.ops[0].flops == 2 * 4 * 32 * 16
    assert report.shape_source.startswith("_output_shapes attributes (TensorFlow's shape inference failed")

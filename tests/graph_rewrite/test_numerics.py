"""The rewritten graphs really compute in half precision, and still compute the same thing.

Overflow probes run this CPU's real half kernels (what they test is that half runs);
accuracy against float32 is measured emulated (``numerics="emulate"``), as a Tensor Core
GPU computes -- a CPU's half kernels would make the numbers depend on the CPU.
"""
import numpy as np
import pytest
import tensorflow as tf
from graph_runner import run_graph
from model_graphs import conv_net, transformer_block

from tfamp_rewrite import rewrite_graph_def

tf1 = tf.compat.v1


def overflow_probe_graph():
    """``[1, 4] x [4, 1]`` of 2**10: 4 * 2**20 is finite in float32, inf in float16."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full([1, 4], 2.0 ** 10, np.float32), name="x")
        w = tf.constant(np.full([4, 1], 2.0 ** 10, np.float32), name="w")
        tf.identity(tf.matmul(x, w, name="matmul"), name="out")
    return graph.as_graph_def()


def test_rewrite_runs_matmul_in_half():
    graph_def = overflow_probe_graph()
    rewritten = rewrite_graph_def(graph_def, fetches=["out"], target="cpu").graph_def
    assert np.isinf(run_graph(rewritten, "out:0")).all()
    assert np.isfinite(run_graph(graph_def, "out:0")).all()


def test_gpu_target_leaves_cpu_placed_nodes_in_float32():
    graph_def = overflow_probe_graph()
    for node in graph_def.node:
        node.device = "/device:CPU:0"
    result = rewrite_graph_def(graph_def, fetches=["out"], target="gpu")
    assert result.report.nodes_converted == 0
    assert np.isfinite(run_graph(result.graph_def, "out:0")).all()


@pytest.mark.parametrize("dtype,tolerance,trained_tolerance", [
    ("float16", 5e-3, 0.1), ("bfloat16", 4e-2, 0.2),
])
def test_conv_net_matches_float32_within_half_tolerance(dtype, tolerance, trained_tolerance):
    """Forward pass and a few training steps of the rewritten conv net track the fp32 graph."""
    model = conv_net()
    rewritten = rewrite_graph_def(model.graph_def, fetches=model.fetches, feeds=model.feeds,
                                  target="cpu", dtype=dtype, numerics="emulate").graph_def
    feeds = model.feed_values(np.random.default_rng(0))
    fetches = ["output:0", "loss:0"]
    reference = run_graph(model.graph_def, fetches, feeds, init="init")
    mixed = run_graph(rewritten, fetches, feeds, init="init")
    scale = np.abs(reference[0]).max()
    assert np.abs(mixed[0] - reference[0]).max() <= tolerance * scale
    assert mixed[1] == pytest.approx(reference[1], rel=tolerance)
    trained_reference = run_graph(model.graph_def, "loss:0", feeds, "init", "train_op", steps=5)
    trained_mixed = run_graph(rewritten, "loss:0", feeds, "init", "train_op", steps=5)
    assert trained_mixed < reference[1]  # training still makes progress
    # five Momentum steps on one batch drive the loss from ~2.6 to ~0.02: the relative gap there
    # is the trajectories' drift (3% in float16, 2% in bfloat16), not one step's error
    assert trained_mixed == pytest.approx(trained_reference, rel=trained_tolerance)


def test_transformer_block_matches_float32():
    model = transformer_block()
    rewritten = rewrite_graph_def(model.graph_def, fetches=model.fetches, feeds=model.feeds,
                                  target="cpu", numerics="emulate").graph_def
    feeds = model.feed_values(np.random.default_rng(1))
    reference = run_graph(model.graph_def, "output:0", feeds, init="init")
    mixed = run_graph(rewritten, "output:0", feeds, init="init")
    assert mixed.dtype == np.float32  # fetches keep their dtype
    np.testing.assert_allclose(mixed, reference, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_kernels_of_this_cpu_run_the_rewritten_models(dtype):
    """Native numerics: the rewritten graphs run on this CPU's half kernels (values vary by CPU)."""
    for model in (conv_net(), transformer_block()):
        rewritten = rewrite_graph_def(model.graph_def, fetches=model.fetches, feeds=model.feeds,
                                      target="cpu", dtype=dtype).graph_def
        feeds = model.feed_values(np.random.default_rng(0))
        reference = run_graph(model.graph_def, "output:0", feeds, init="init")
        mixed = run_graph(rewritten, "output:0", feeds, init="init")
        assert mixed.dtype == reference.dtype and mixed.shape == reference.shape
        assert np.isfinite(mixed).all()


def test_emulating_a_graph_already_in_half_says_its_half_nodes_run_native_kernels():
    """A graph the command line converted, loaded by a session that emulates: its half
    MatMul is not the rewrite's, so it runs a native half kernel -- and the line says so."""
    graph_def = overflow_probe_graph()
    half = rewrite_graph_def(graph_def, fetches=["out"], target="cpu").graph_def
    again = rewrite_graph_def(half, fetches=["out"], target="cpu", numerics="emulate").report
    assert again.emulation.native_half_nodes == 1  # the MatMul; its Casts are not counted
    assert "1 node(s) already in half in the graph run native half kernels" in again.one_line()
    fresh = rewrite_graph_def(graph_def, fetches=["out"], target="cpu", numerics="emulate").report
    assert fresh.emulation.native_half_nodes == 0 and "already in half" not in fresh.one_line()

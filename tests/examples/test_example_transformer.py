"""examples/transformer: a tiny BERT-style encoder trains in fp32, AMP and AMP+XLA."""
from __future__ import annotations

import numpy as np
import pytest
from example_runs import (
    BENCHMARK,
    TINY_TRANSFORMER,
    assert_amp_loss_tracks_fp32,
    assert_emulated_amp_ran_float32_kernels,
    assert_only_amp_ran_half_kernels,
    example_main,
    fp32_and_amp_fixture,
    half_hlo_instructions,
    run_example_process,
    xla_dump_flags,
)

runs = fp32_and_amp_fixture("transformer", TINY_TRANSFORMER + BENCHMARK)


def test_amp_executes_attention_and_dense_matmuls_in_half(runs):
    assert_only_amp_ran_half_kernels(runs)
    half_ops = runs["amp"]["executed_graph"]["half_compute_ops"]
    assert half_ops.get("BatchMatMulV2", 0) >= 2 and half_ops.get("MatMul", 0) >= 6


def test_emulated_amp_runs_the_same_rewrite_on_float32_kernels(runs):
    assert_emulated_amp_ran_float32_kernels(runs)


def test_amp_loss_tracks_fp32_on_the_same_seed(runs):
    assert_amp_loss_tracks_fp32(runs, rel=1e-2)
    assert runs["amp"]["unit"] == "sequences/s" and runs["amp"]["throughput"] > 0


@pytest.mark.tf1_behavior("XLA clusters what the rewrite leaves the same way whatever built the graph; "
                          "one pass is enough, and TF1 programs are what users run with it")
def test_amp_with_xla_compiles_half_matmuls_into_clusters(runs, tmp_path):
    args = TINY_TRANSFORMER + BENCHMARK + ["--use_tf_amp", "--use_xla"]
    result = run_example_process("transformer", args, tmp_path, **xla_dump_flags(tmp_path / "hlo"))
    assert result["executed_graph"]["xla_compiled"], result["executed_graph"]["xla_ops"]
    # The clusters hide their kernels from step stats; the HLO they were compiled from shows them.
    assert any("BatchMatMulV2" in line for line in half_hlo_instructions(tmp_path / "hlo", "dot"))
    assert result["final_loss"] == pytest.approx(runs["fp32"]["final_loss"], rel=0.05)
    assert " - Summary: train_throughput : " in result["stdout"] and " sequences/s " in result["stdout"]


def test_every_masked_token_is_visible_elsewhere_in_its_phase():
    example_main("transformer")  # puts examples/ on the path
    from transformer import data

    inputs, targets, weights = data.make_examples(200, 16, 12, seed=3)
    assert (weights.sum(axis=1) >= 2).all() and (inputs[weights > 0] == data.MASK).all()
    assert (inputs[weights == 0] == targets[weights == 0]).all()
    for row in range(200):
        period = next(p for p in range(data.MIN_PERIOD, data.MAX_PERIOD + 1)
                      if (targets[row, p:] == targets[row, :-p]).all())
        for position in np.flatnonzero(weights[row]):
            same_phase = inputs[row, position % period::period]
            assert targets[row, position] in same_phase[same_phase != data.MASK]

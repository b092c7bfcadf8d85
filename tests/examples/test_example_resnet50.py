"""examples/resnet50: a tiny ResNet-50 v1.5 trains end to end in fp32, AMP and AMP+XLA.

AMP is judged by what the executor ran (partition graphs and step stats of a traced
step), not by what the rewrite claims; XLA by the ``_XlaCompile``/``_XlaRun`` ops of the
executed graph.
"""
from __future__ import annotations

import io
import math
import os

import numpy as np
import pytest
import tensorflow as tf
from example_runs import (
    BENCHMARK,
    TINY_RESNET,
    assert_amp_loss_tracks_fp32,
    assert_emulated_amp_ran_float32_kernels,
    assert_only_amp_ran_half_kernels,
    example_main,
    fp32_and_amp_fixture,
    half_hlo_instructions,
    run_example_process,
    summary_tags,
    xla_dump_flags,
)

runs = fp32_and_amp_fixture("resnet50", TINY_RESNET + BENCHMARK)


def test_amp_executes_every_convolution_and_matmul_in_half(runs):
    assert_only_amp_ran_half_kernels(runs)
    assert runs["amp"]["rewrite"]["nodes_converted"] > 0 and runs["fp32"]["rewrite"] is None


def test_amp_moves_far_fewer_activation_bytes_than_fp32(runs):
    amp, fp32 = runs["amp"]["executed_graph"], runs["fp32"]["executed_graph"]
    assert amp["half_activation_bytes"] > 0.7 * amp["activation_bytes"]
    assert amp["activation_bytes"] < 0.75 * fp32["activation_bytes"]


def test_emulated_amp_runs_the_same_rewrite_on_float32_kernels(runs):
    assert_emulated_amp_ran_float32_kernels(runs)


def test_amp_loss_tracks_fp32_on_the_same_seed(runs):
    assert_amp_loss_tracks_fp32(runs, rel=1e-2)
    assert all(step["loss_scale"] >= 1 for step in runs["amp"]["history"])
    assert all(step["loss_scale"] is None for step in runs["fp32"]["history"])


def test_results_json_and_tensorboard_events_hold_throughput_and_loss_scale(runs):
    for name in ("fp32", "amp"):
        assert os.path.exists(runs[name]["dir"] / "results_training_benchmark.json")
        assert runs[name]["throughput"] > 0 and runs[name]["unit"] == "images/s"
    assert {"loss", "learning_rate", "current_loss_scale"} <= summary_tags(runs["amp"]["dir"])
    assert "current_loss_scale" not in summary_tags(runs["fp32"]["dir"])


@pytest.mark.tf1_behavior("XLA clusters what the rewrite leaves the same way whatever built the graph; "
                          "one pass is enough, and TF1 programs are what users run with it")
def test_amp_with_xla_compiles_half_convolutions_into_clusters(runs, tmp_path):
    args = TINY_RESNET + BENCHMARK + ["--use_tf_amp", "--use_xla"]
    result = run_example_process("resnet50", args, tmp_path, **xla_dump_flags(tmp_path / "hlo"))
    graph = result["executed_graph"]
    assert graph["xla_compiled"], graph["xla_ops"]
    # The clusters hide their kernels from step stats; the HLO they were compiled from shows them.
    assert half_hlo_instructions(tmp_path / "hlo", "convolution")
    assert result["rewrite"]["nodes_converted"] > 0
    assert result["final_loss"] == pytest.approx(runs["fp32"]["final_loss"], rel=0.05)
    assert " - Summary: train_throughput : " in result["stdout"] and " images/s " in result["stdout"]


def _write_tfrecords(directory, prefix, count, rng):
    from PIL import Image

    with tf.io.TFRecordWriter(str(directory / ("%s-00000-of-00001" % prefix))) as writer:
        for index in range(count):
            label = index % 4
            noise = rng.integers(0, 30, (40, 48, 3), dtype=np.uint8)
            pixels = np.full((40, 48, 3), 60 * label, np.uint8) + noise
            jpeg = io.BytesIO()
            Image.fromarray(pixels).save(jpeg, "JPEG")
            example = tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg.getvalue()])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())


def test_train_resumes_from_its_checkpoint_and_evaluate_restores_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    rng = np.random.default_rng(0)
    data_dir, results_dir = tmp_path / "data", tmp_path / "results"
    data_dir.mkdir()
    _write_tfrecords(data_dir, "train", 16, rng)
    _write_tfrecords(data_dir, "validation", 8, rng)
    main = example_main("resnet50")
    common = TINY_RESNET + ["--data_dir", str(data_dir), "--results_dir", str(results_dir),
                            "--iter_unit", "epoch", "--warmup_steps", "0"]

    first = main(common + ["--mode", "train", "--num_iter", "1"])     # 16 images / 8 = 2 steps
    resumed = main(common + ["--mode", "train", "--num_iter", "2"])   # 2 more, from step 2
    assert [h["step"] for h in first["history"]] == [1, 2]
    assert [h["step"] for h in resumed["history"]] == [3, 4]
    assert tf.train.latest_checkpoint(str(results_dir)).endswith("model.ckpt-4")

    evaluated = main(common + ["--mode", "evaluate", "--num_iter", "1", "--use_tf_amp", "--step_stats"])
    assert evaluated["steps"] == 1
    assert 0.0 <= evaluated["metrics"]["top1_accuracy"] <= evaluated["metrics"]["top5_accuracy"] <= 1.0
    assert math.isfinite(evaluated["metrics"]["loss"])
    assert evaluated["executed_graph"]["half_compute_nodes"] > 0


def test_evaluate_without_a_checkpoint_says_which_run_makes_one(tmp_path):
    with pytest.raises(SystemExit, match="run --mode train --results_dir"):
        example_main("resnet50")(TINY_RESNET + ["--mode", "evaluate", "--results_dir", str(tmp_path)])

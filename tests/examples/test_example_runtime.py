"""examples/runtime and benchmarks/amp_examples.py: the counting and the arithmetic users read."""
from __future__ import annotations

import importlib.util
import os

import pytest
from example_runs import example_main
from repo_paths import REPO
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import config_pb2

example_main("resnet50")  # puts examples/ on the path
from runtime import executed_graph, flags, progress  # noqa: E402


def _add_node(partition, name, op, dtype=None):
    node = partition.node.add(name=name, op=op)
    if dtype is not None:
        node.attr["T"].type = dtype


def _add_output(step_stats, name, dtype, shape, nbytes):
    node_stats = step_stats.dev_stats[0].node_stats.add(node_name=name)
    description = node_stats.output.add().tensor_description
    description.dtype = dtype
    for size in shape:
        description.shape.dim.add(size=size)
    description.allocation_description.requested_bytes = nbytes


def test_executed_graph_counts_half_kernels_activation_bytes_and_xla_ops():
    metadata = config_pb2.RunMetadata()
    partition = metadata.partition_graphs.add()
    _add_node(partition, "conv", "Conv2D", types_pb2.DT_HALF)
    _add_node(partition, "conv_grad", "Conv2DBackpropFilter", types_pb2.DT_HALF)
    _add_node(partition, "logits", "_MklMatMul", types_pb2.DT_FLOAT)
    _add_node(partition, "relu", "Relu", types_pb2.DT_HALF)            # not a compute op
    _add_node(partition, "cluster/compile", "_XlaCompile")
    _add_node(partition, "cluster/run", "_XlaRun")
    metadata.step_stats.dev_stats.add(device="/cpu:0")
    _add_output(metadata.step_stats, "conv", types_pb2.DT_HALF, [8, 4, 4, 16], 4096)
    _add_output(metadata.step_stats, "relu", types_pb2.DT_FLOAT, [8, 16], 512)
    _add_output(metadata.step_stats, "kernel", types_pb2.DT_HALF, [3, 3, 3, 16], 864)  # a weight
    _add_output(metadata.step_stats, "labels", types_pb2.DT_INT32, [8], 32)              # rank 1

    stats = executed_graph.ExecutedGraph.from_run_metadata(metadata, batch_size=8)

    assert (stats.half_compute_nodes, stats.float_compute_nodes) == (2, 1)
    assert stats.half_compute_ops == {"Conv2D": 1, "Conv2DBackpropFilter": 1}
    assert (stats.output_bytes, stats.half_output_bytes) == (4096 + 512 + 864 + 32, 4096 + 864)
    assert (stats.activation_bytes, stats.half_activation_bytes) == (4096 + 512, 4096)
    assert stats.xla_compiled and stats.to_dict()["xla_compiled"]


def test_executed_graph_without_xla_ops_is_not_compiled():
    assert not executed_graph.ExecutedGraph(xla_ops={"_XlaRun": 1}).xla_compiled


def test_throughput_leaves_out_the_warmup_steps():
    meter = progress.ThroughputMeter(batch_size=10, warmup_steps=2)
    for seconds in (5.0, 3.0, 0.5, 0.25, 0.25):
        meter.record(seconds)
    assert meter.counted_steps == 3
    assert meter.throughput() == pytest.approx(30 / 1.0)
    assert progress.ThroughputMeter(10, warmup_steps=5).throughput() is None


def test_progress_lines_have_step_rate_and_values(capsys):
    printer = progress.ProgressPrinter(batch_size=4, steps_per_epoch=3, display_every=2,
                                       rate_key="imgs_per_sec", unit="images/s")
    for step in range(1, 6):
        printer.step(step, 0.5, {"loss": 1.25, "loss_scale": 32768.0}, last=step == 5)
    printer.summary({"final_loss": 1.25}, "train_throughput", 8.0)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" - ")[1] for line in lines] == [
        "(0, 2) imgs_per_sec : 8.00 loss : 1.2500 loss_scale : 32768",
        "(1, 4) imgs_per_sec : 8.00 loss : 1.2500 loss_scale : 32768",
        "(1, 5) imgs_per_sec : 8.00 loss : 1.2500 loss_scale : 32768",
        "Summary: train_throughput : 8.00 images/s final_loss : 1.2500",
    ]


@pytest.mark.parametrize("unit, num_iter, expected", [("batch", 7, 7), ("epoch", 2, 2 * 13)])
def test_total_steps_counts_batches_or_epochs(unit, num_iter, expected):
    assert flags.total_steps(num_iter, unit, batch_size=8, examples_per_epoch=100) == expected


def test_benchmark_table_gives_ratios_against_the_first_configuration():
    path = os.path.join(REPO, "benchmarks", "amp_examples.py")
    spec = importlib.util.spec_from_file_location("amp_examples", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)

    def result(throughput, activations, half, xla):
        return {"throughput": throughput, "unit": "images/s", "executed_graph": {
            "activation_bytes": activations, "output_bytes": 2 * activations, "half_compute_nodes": half,
            "float_compute_nodes": 4 - half, "xla_compiled": xla}}

    rows = benchmark.table([("fp32", result(100.0, 8e6, 0, False)), ("AMP", result(25.0, 4e6, 4, False)),
                            ("AMP+XLA", result(50.0, 2e6, 0, True))]).splitlines()
    assert rows[1].split() == ["fp32", "100.0", "1.00x", "8.00", "1.00x", "16.00", "1.00x", "0/4", "-"]
    assert rows[2].split() == ["AMP", "25.0", "0.25x", "4.00", "0.50x", "8.00", "0.50x", "4/4", "-"]
    assert rows[3].split()[-1] == "compiled"

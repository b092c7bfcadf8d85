"""Running the example scripts from tests: imported into this process, or in a new one.

In-process runs are the default (no TensorFlow start-up per run).  XLA runs need a new
process: TensorFlow reads ``TF_XLA_FLAGS`` once per process.  The ``TINY_*`` flags
keep each model's structure at a size the CPU's float16 kernels get through in seconds.
"""
from __future__ import annotations

import glob
import importlib
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from repo_paths import EXAMPLES
from tf1_behavior import python_prefix

TINY_RESNET = ["--image_size", "32", "--width", "8", "--blocks", "1,1,1,1", "--num_classes", "10",
               "--batch_size", "8", "--lr_warmup_epochs", "0", "--lr_init", "1.0"]
# A short training benchmark that also traces one step (what the executor ran).
BENCHMARK = ["--mode", "training_benchmark", "--num_iter", "6", "--warmup_steps", "2", "--step_stats"]
TINY_TRANSFORMER = ["--seq_len", "8", "--vocab_size", "16", "--hidden_size", "16", "--num_heads", "2",
                    "--ffn_size", "32", "--num_layers", "1", "--dropout", "0", "--batch_size", "8",
                    "--num_examples", "64", "--lr_warmup_steps", "1", "--lr_init", "0.01"]


def example_main(name: str):
    """The ``main`` function of ``examples/<name>/main.py``."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    return importlib.import_module(name + ".main").main


def run_example_process(name: str, args, results_dir, **env_vars) -> dict:
    """Runs ``examples/<name>/main.py args`` in a new process; returns its results JSON."""
    env = dict(os.environ, TFAMP_REWRITE_TARGET="cpu", TF_CPP_MIN_LOG_LEVEL="2", **env_vars)
    command = [sys.executable, *python_prefix(), os.path.join(EXAMPLES, name, "main.py"),
               "--results_dir", str(results_dir)]
    completed = subprocess.run(command + list(args), env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    mode = args[args.index("--mode") + 1]
    with open(os.path.join(str(results_dir), "results_%s.json" % mode)) as handle:
        result = json.load(handle)
    result["stdout"] = completed.stdout
    return result


def xla_dump_flags(dump_dir) -> dict:
    """Environment that makes XLA write the HLO of every cluster it compiles to ``dump_dir``."""
    return {"XLA_FLAGS": "--xla_dump_to=%s --xla_dump_hlo_as_text" % dump_dir}


def half_hlo_instructions(dump_dir, opcode: str) -> list:
    """The ``opcode`` instructions with a float16 result in the HLO XLA was given to compile."""
    found = []
    for path in glob.glob(os.path.join(str(dump_dir), "*before_optimizations.txt")):
        with open(path) as handle:
            found.extend(line.strip() for line in handle if " = f16[" in line and " %s(" % opcode in line)
    return found


def summary_tags(results_dir) -> set:
    """Every scalar tag in the TensorBoard event files of ``results_dir``."""
    tags = set()
    for path in glob.glob(os.path.join(str(results_dir), "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    return tags


def fp32_and_amp_fixture(name: str, args):
    """A module-scoped fixture: ``{"fp32", "amp", "amp_emulated": results}`` of ``examples/<name>``.

    All run in this process with the same flags and seed; AMP adds ``--use_tf_amp`` with
    the rewrite on the CPU, on this CPU's half kernels (``amp``) or emulating a Tensor Core
    GPU's numerics (``amp_emulated``, ``TFAMP_REWRITE_NUMERICS=emulate``).  Each result
    also has ``"dir"``, its ``--results_dir``.
    """
    @pytest.fixture(scope="module")
    def runs(tmp_path_factory):
        main = example_main(name)
        results = {}
        variants = (("fp32", [], "native"), ("amp", ["--use_tf_amp"], "native"),
                    ("amp_emulated", ["--use_tf_amp"], "emulate"))
        for precision, extra, numerics in variants:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("TFAMP_REWRITE_TARGET", "cpu")
                patch.setenv("TFAMP_REWRITE_NUMERICS", numerics)
                results_dir = tmp_path_factory.mktemp(name + "_" + precision)
                results[precision] = main(list(args) + extra + ["--results_dir", str(results_dir)])
                results[precision]["dir"] = results_dir
        return results

    return runs


def assert_only_amp_ran_half_kernels(runs: dict) -> None:
    """The AMP run executed every conv/matmul node in half precision, the fp32 run none."""
    amp, fp32 = runs["amp"]["executed_graph"], runs["fp32"]["executed_graph"]
    assert amp["half_compute_nodes"] > 0 and amp["float_compute_nodes"] == 0, amp
    assert fp32["half_compute_nodes"] == 0 and fp32["float_compute_nodes"] > 0, fp32


def assert_emulated_amp_ran_float32_kernels(runs: dict) -> None:
    """Emulated AMP: the same rewrite, but the executor ran float32 conv/matmul kernels only."""
    emulated, native = runs["amp_emulated"], runs["amp"]
    assert emulated["rewrite"]["numerics"] == "emulate" and native["rewrite"]["numerics"] == "native"
    assert emulated["rewrite"]["nodes_converted"] == native["rewrite"]["nodes_converted"] > 0
    graph = emulated["executed_graph"]
    assert graph["half_compute_nodes"] == 0 and graph["float_compute_nodes"] > 0, graph


def assert_amp_loss_tracks_fp32(runs: dict, rel: float) -> None:
    """Both runs learn, and at every step the AMP loss -- emulated, as a Tensor Core GPU
    computes it, so that the CPU does not decide -- is within ``rel`` of the fp32 loss."""
    fp32, amp = runs["fp32"]["history"], runs["amp_emulated"]["history"]
    assert len(fp32) == len(amp) > 1
    assert fp32[-1]["loss"] < fp32[0]["loss"] and amp[-1]["loss"] < amp[0]["loss"]
    for first, second in zip(fp32, amp):
        assert second["loss"] == pytest.approx(first["loss"], rel=rel), (first, second)

"""The GPU harness (tests/gpu/gpu_check.py, `make test-gpu`) on a machine without a GPU.

What can be checked here is checked: the no-GPU path, the whole harness end to end on the
CPU grid emulation (without TensorFlow, under AddressSanitizer), its arithmetic and tables,
the architecture choice, and the nvcc build of the real GPU library with its error path.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import gpu_check
import harness_build
import kernel_bandwidth
import model_gradients
import numpy as np
import pytest
from cuda_driver import visible_gpu
from harness_library import HarnessError, KernelHarness
from repo_paths import REPO

GPU_CHECK = os.path.join(REPO, "tests", "gpu", "gpu_check.py")
# Runs a script as `python3 script ...` does, in a process where importing TensorFlow fails.
WITHOUT_TENSORFLOW = ("import os, runpy, sys; sys.modules['tensorflow'] = None; "
                      "sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(sys.argv[0])); "
                      "runpy.run_path(sys.argv[0], run_name='__main__')")


def run(argv, **env):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=dict(os.environ, **env), timeout=600)


def test_make_test_gpu_without_a_gpu_says_so_and_exits_0():
    """CUDA_VISIBLE_DEVICES="" hides any GPU (the driver then reports no device)."""
    result = run(["make", "-s", "--no-print-directory", "-C", REPO, "test-gpu",
                  f"PYTHON={sys.executable}"], CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stdout
    (line,) = result.stdout.splitlines()
    assert line.startswith("test-gpu: no CUDA GPU visible (") and line.endswith("; nothing run")


def test_the_whole_harness_runs_on_the_emulation_without_tensorflow(emulated_kernel):
    """Correctness suite, launch plan, sanitizer run (AddressSanitizer on the emulation, each
    buffer its own allocation) and verdict, with TensorFlow unimportable."""
    result = run([sys.executable, "-c", WITHOUT_TENSORFLOW, GPU_CHECK, "--emulate", "--library",
                  emulated_kernel.path, "--suite", "sanitizer", "--no-timing"])
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert any(line.startswith("test-gpu: correctness (sanitizer): ") and
               line.endswith(": all passed") for line in lines), result.stdout
    assert any(line.startswith("test-gpu: AddressSanitizer: clean (exit 0") for line in lines)
    plan = [line.split() for line in lines if line.strip().startswith(tuple(model_gradients.MODELS))]
    assert [(row[0], int(row[1]), int(row[2])) for row in plan] == [
        (name, count, elements) for name, (count, elements) in
        model_gradients.model_summary().items()]
    assert all(float(row[6].rstrip("%")) < 10 for row in plan)  # tail waste
    assert lines[-1] == "test-gpu: PASS"


def test_a_failing_case_fails_the_run(emulated_kernel, monkeypatch, capsys):
    """The verdict follows the checks: a kernel that writes one element short fails."""
    real_unscale = KernelHarness.unscale

    def one_short(self, tensors, *args):
        tensors._sizes[np.argmax(tensors._sizes)] -= 1
        return real_unscale(self, tensors, *args)

    monkeypatch.setattr(KernelHarness, "unscale", one_short)
    code = gpu_check.main(["--emulate", "--library", emulated_kernel.path, "--suite",
                           "sanitizer", "--no-timing", "--no-sanitizers"])
    out = capsys.readouterr().out
    assert code == 1 and out.splitlines()[-1] == "test-gpu: FAIL"
    assert "never written (still poisoned" in out


def test_bandwidth_table_on_the_emulation(emulated_kernel, monkeypatch, capsys):
    """The timing path end to end, on small stand-ins for the models."""
    small = {"resnet50": [1000, 3, 70001, 64], "bert_base": [5000] * 3}
    monkeypatch.setattr(model_gradients, "model_sizes", small.__getitem__)
    gpu_check.report_bandwidth(emulated_kernel, ["resnet50", "bert_base"], 2, emulated=True)
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.strip().startswith(("resnet50", "bert_base"))]
    # Per model 3 dtypes, in and out of place; chunk sweep over 3 dtypes on resnet50; the
    # launch sweep on the last model.
    assert len(rows) == 2 * 6 + 3 * len(gpu_check.CHUNK_SWEEP) + len(gpu_check.LAUNCH_SWEEP)
    assert [row[1] for row in rows[:6]] == ["float32", "float32", "float16", "float16",
                                            "bfloat16", "bfloat16"]
    first = rows[0]  # resnet50 float32: tensors, MB, launches, table, blocks, ...
    assert first[:2] == ["resnet50", "float32"] and int(first[2]) == 4
    assert float(first[3]) == pytest.approx(sum(small["resnet50"]) * 4 / 1e6, abs=0.05)
    plan = emulated_kernel.plan(small["resnet50"], [0] * 4)
    assert (int(first[4]), first[5], int(first[6])) == (plan.launches, "4K", plan.blocks)
    assert all(row[-1] == "ok" or row[-2] == "BELOW" for row in rows)
    assert "(emulated: CPU times, not GPU figures)" in lines[0]
    assert lines[1] == "  PyTorch and composite columns empty: emulated run: no GPU to time peers on"
    assert all(row.count("-") == 4 for row in rows)  # PyTorch and composite ms and ratios


def test_bandwidth_arithmetic():
    row = kernel_bandwidth.BandwidthRow("x", 2, 1000, 4000, 1, 1, 4096, kernel_ms=0.002,
                                        host_ms=0.001, copy_ms=0.0017, pytorch_ms=None,
                                        composite_ms=None)
    assert row.kernel_gbps == pytest.approx(4.0)  # 8000 bytes moved in 2 us
    assert row.copy_gbps == pytest.approx(8000 / 1700)
    assert row.ratio == pytest.approx(0.85)
    assert row.vs_pytorch is None and row.vs_composite is None
    assert kernel_bandwidth.format_rows([row])[-1].endswith("ok")
    assert kernel_bandwidth.format_rows([row._replace(copy_ms=0.0016)])[-1].endswith(
        "BELOW memcpy")
    with_peers = row._replace(pytorch_ms=0.0023, composite_ms=0.02)
    assert with_peers.vs_pytorch == pytest.approx(1.15)
    assert with_peers.vs_composite == pytest.approx(10.0)
    line = kernel_bandwidth.format_rows([with_peers])[-1]
    assert line.endswith("BELOW PyTorch") and " 1.15 " in line and " 10.00 " in line
    assert kernel_bandwidth.format_rows([with_peers._replace(pytorch_ms=0.0024)])[-1].endswith(
        "ok")


def test_without_pytorch_the_peer_columns_say_why():
    """The machine's python3 here has no PyTorch (or no GPU for it): one line says which."""
    import peer_timing

    torch, why = peer_timing.load_torch()
    if torch is not None:
        pytest.skip("PyTorch runs on a GPU here: make test-gpu times it")
    assert why.startswith(("PyTorch is not importable (", "PyTorch ")) and "\n" not in why
    assert kernel_bandwidth.arena_offsets([1, 256, 257, 0]) == [0, 256, 512, 1024, 1024]


def test_measure_times_the_op_and_a_copy_of_the_same_bytes(emulated_kernel):
    row = kernel_bandwidth.measure(emulated_kernel, "small", [300, 20000, 7], "float16", iterations=2,
                            chunk_elements=4096, in_place=True)
    assert (row.tensors, row.elements, row.nbytes) == (3, 20307, 2 * 20307)
    assert (row.launches, row.blocks) == (1, 5)
    assert row.kernel_ms > 0 and row.copy_ms > 0 and row.host_ms > 0


@pytest.mark.parametrize("argv, message", [
    (["--models", "resnet50,vgg"], "--models: unknown vgg"),
    (["--iterations", "0"], "--iterations must be >= 1"),
    (["--sanitizer-pass"], "--sanitizer-pass needs --library"),
    (["--emulate", "--build-only"], "not allowed with argument"),
    (["--variant", "x"], "write NAME=NVCC_FLAGS"),
    (["--emulate", "--variant", "a=-DX"], "--variant needs a GPU build"),
])
def test_bad_arguments_are_usage_errors(argv, message):
    result = run([sys.executable, GPU_CHECK, *argv])
    assert result.returncode == 2 and message in result.stdout


@pytest.mark.parametrize("exit_code", [0, gpu_check.SANITIZER_ERROR_EXIT])
def test_compute_sanitizer_runs_each_tool_on_the_child_suite(monkeypatch, tmp_path, capsys,
                                                              exit_code):
    """The command lines given to compute-sanitizer (found on PATH here), and the verdict
    read from its exit status, with its summary line quoted."""
    sanitizer = tmp_path / "compute-sanitizer"
    sanitizer.write_text("#!/bin/sh\nexit 0\n")
    sanitizer.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        summary = f"========= ERROR SUMMARY: {0 if exit_code == 0 else 3} errors"
        return subprocess.CompletedProcess(argv, exit_code, f"sanitizer suite: ...\n{summary}\n")

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    gpu_library = type("Harness", (), {"path": "/x/libtfamp_kernel_harness_gpu.so"})()
    clean = gpu_check.run_sanitizers(gpu_check.parse_args([]), gpu_library, None, tmp_path)
    assert clean == (exit_code == 0)
    assert [argv[:3] for argv in calls] == [[str(sanitizer), "--tool", tool]
                                           for tool in gpu_check.SANITIZER_TOOLS]
    for argv in calls:
        assert argv[argv.index("--error-exitcode") + 1] == str(gpu_check.SANITIZER_ERROR_EXIT)
        assert argv[-3:] == ["--sanitizer-pass", "--library", gpu_library.path]
    assert "--leak-check" in calls[0]
    out = capsys.readouterr().out
    verdict = "clean" if exit_code == 0 else "FAILED"
    assert out.count(f"compute-sanitizer --tool memcheck: {verdict}") == 1
    assert f"ERROR SUMMARY: {0 if exit_code == 0 else 3} errors" in out


# --- the real GPU build --------------------------------------------------------------------

def fake_toolchain(archs):
    return harness_build.cuda_toolchain_module().CudaToolchain("/opt/nvcc", "13.0", tuple(archs),
                                                               "/opt/lib")


@pytest.mark.parametrize("capability, archs", [((9, 0), [90]), ((8, 6), [86]),
                                              ((12, 1), [121]), ((13, 0), [121])])
def test_the_harness_is_built_for_the_gpu_it_runs_on(capability, archs):
    """Machine code for a supported GPU; PTX of the newest supported arch for a newer one."""
    toolchain = fake_toolchain([75, 80, 86, 87, 89, 90, 100, 120, 121])
    assert harness_build.archs_for_device(toolchain, *capability) == archs


def test_a_gpu_older_than_nvcc_supports_is_a_clear_error():
    with pytest.raises(harness_build.HarnessBuildError, match="sm_70.*CUDA 12 or older"):
        harness_build.archs_for_device(fake_toolchain([75, 80, 90]), 7, 0)


@pytest.fixture(scope="module")
def gpu_build(tmp_path_factory):
    toolchain = harness_build.find_toolchain()
    if toolchain is None:
        pytest.skip("no nvcc on this machine")
    return harness_build.build_gpu(tmp_path_factory.mktemp("gpu-harness"), [75], toolchain)


def test_nvcc_builds_the_gpu_harness_with_registers_for_two_blocks_per_sm(gpu_build):
    """ptxas's report is read back; 512-thread blocks, two per SM: <= 64 registers, no spill."""
    _, resources = gpu_build
    assert sorted(resources) == [("sm_75", 203), ("sm_75", 1636)]  # nvcc >= 12.1: both tables
    assert all(r.registers <= 64 and r.spill_bytes == 0 for r in resources.values())


@pytest.mark.parametrize("flags, tables", [
    ([], [203, 1636]),
    (["-DTFAMP_KERNEL_PARAMETERS_4KB_ONLY"], [203]),  # a pre-Volta architecture in the build
])
def test_the_32kb_table_kernel_is_compiled_only_where_every_architecture_takes_it(
        tmp_path, flags, tables):
    """One kernel per launch-table size in the PTX of an nvcc >= 12.1 build; the 4 KB one
    alone when the build defines TFAMP_KERNEL_PARAMETERS_4KB_ONLY."""
    toolchain = harness_build.find_toolchain()
    if toolchain is None:
        pytest.skip("no nvcc on this machine")
    ptx = tmp_path / "kernel.ptx"
    subprocess.run([toolchain.nvcc, "-std=c++14", "-ptx", "-arch=compute_75", *flags, "-I",
                    str(harness_build.OP_SOURCES), str(harness_build.OP_SOURCES / "gpu_launch.cu"),
                    "-o", str(ptx)], check=True)
    entries = re.findall(r"\.entry\s+\S*LaunchTableILi(\d+)E", ptx.read_text())
    assert sorted(int(slots) for slots in entries) == tables


def test_gpu_build_loads_and_reports_cuda_errors_without_a_gpu(gpu_build, emulated_kernel,
                                                               driver_version):
    if visible_gpu()[0] is not None:
        pytest.skip("a GPU is visible: `make test-gpu` runs this build for real")
    library, _ = gpu_build
    harness = KernelHarness(library)
    assert not harness.emulated
    # No driver answers cudaDriverGetVersion here: 4 KB launch tables, as under an old driver.
    driver_version(12000)
    assert ((harness.max_tensors, harness.chunk_elements) ==
            (emulated_kernel.max_tensors, emulated_kernel.chunk_elements))
    with pytest.raises(HarnessError, match="^device: cudaGetDeviceCount: "):
        harness.device()  # no driver or no device here; CUDA's own words
    with pytest.raises(HarnessError, match="emulation controls"):
        harness.take_counts()

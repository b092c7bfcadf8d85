"""Building, caching, packaging and loading the op libraries (UnscaleAndCheckFinite, RoundToHalf)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from repo_paths import REPO as REPO_PATH
from tensorflow.python.framework import kernels

import tfamp_rewrite
from tfamp_rewrite.fused_op import build as fused_op_build
from tfamp_rewrite.fused_op import cuda_toolchain as fused_op_cuda
from tfamp_rewrite.fused_op import op as fused_op

REPO = Path(REPO_PATH)

# Loads one library in a fresh process (an op can be registered only once per process).
LOAD_AND_RUN = """
import json, sys
import numpy as np, tensorflow as tf
from tensorflow.python.framework import kernels
module = tf.load_op_library(sys.argv[1])
registered = kernels.get_registered_kernels_for_op("UnscaleAndCheckFinite").kernel
out, ok = module.unscale_and_check_finite(
    [tf.constant([1.0, 2.0]), tf.constant([np.inf, 6.0], tf.float16)], 0.5)
print(json.dumps({"devices": sorted(k.device_type for k in registered),
                  "unscaled": [o.numpy().tolist() for o in out], "all_finite": bool(ok)}))
"""


@pytest.fixture(scope="module")
def libraries():
    return fused_op_build.build_libraries()  # cached by `make op`


@pytest.fixture(scope="module")
def loaded_in_fresh_processes(libraries):
    """{"cpu": ..., "gpu": ...}: what LOAD_AND_RUN printed for each built library."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    built = {"cpu": libraries.cpu, "gpu": libraries.gpu}
    processes = {
        variant: subprocess.Popen([sys.executable, "-c", LOAD_AND_RUN, str(path)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True)
        for variant, path in built.items() if path is not None
    }
    results = {}
    for variant, process in processes.items():
        stdout, stderr = process.communicate()
        assert process.returncode == 0, f"{variant} library: {stderr}"
        results[variant] = json.loads(stdout.splitlines()[-1])
    return results


def test_cpu_library_loads_and_computes(loaded_in_fresh_processes):
    assert loaded_in_fresh_processes["cpu"] == {
        "devices": ["CPU"], "unscaled": [[0.5, 1.0], [float("inf"), 3.0]], "all_finite": False}


def test_gpu_library_is_built_whenever_nvcc_is_found_and_loads_on_tensorflow_cpu(
        libraries, loaded_in_fresh_processes):
    if fused_op_cuda.find_cuda_toolchain() is None:
        pytest.skip("no nvcc on this machine: the GPU library is legitimately not built")
    assert libraries.gpu_error is None and libraries.gpu is not None
    loaded = loaded_in_fresh_processes["gpu"]
    assert loaded["devices"] == ["CPU", "GPU"]
    assert loaded["unscaled"] == [[0.5, 1.0], [float("inf"), 3.0]]


def test_this_process_uses_the_gpu_enabled_library_when_built(libraries):
    assert tfamp_rewrite.fused_op_available()
    registered = kernels.get_registered_kernels_for_op(fused_op.OP_TYPE).kernel
    devices = sorted(k.device_type for k in registered)
    assert devices == (["CPU", "GPU"] if libraries.gpu else ["CPU"])


def test_second_build_is_a_cache_hit(libraries):
    mtime = libraries.cpu.stat().st_mtime_ns
    again = fused_op_build.build_libraries()
    assert again.directory == libraries.directory and again.cpu.stat().st_mtime_ns == mtime


def test_cache_directory_follows_tensorflow_flags_and_source_bytes(monkeypatch, tmp_path):
    built = []

    def pretend_to_build(directory, steps):
        built.append(directory)
        directory.mkdir(parents=True)
        (directory / fused_op_build.CPU_LIBRARY).write_text("")
        (directory / fused_op_build.GPU_LIBRARY).write_text("")

    monkeypatch.setenv(fused_op_build.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(fused_op_build, "_build_into", pretend_to_build)
    first = fused_op_build.build_libraries().directory
    assert str(first).startswith(str(tmp_path / "cache"))
    assert fused_op_build.build_libraries().directory == first

    installed = fused_op_build.installed_tensorflow()
    other_flags = fused_op_build.build_libraries(tensorflow=installed._replace(
        compile_flags=installed.compile_flags + ["-DOTHER"])).directory

    sources = tmp_path / "src"
    shutil.copytree(str(fused_op_build.sources_root()), str(sources))
    monkeypatch.setattr(fused_op_build, "sources_root", lambda: sources)
    changed = []
    for source in ("unscale_and_check_finite/cpu_kernel.cc", "round_to_half/round_element.h"):
        with open(str(sources / source), "a") as f:
            f.write("// changed\n")
        changed.append(fused_op_build.build_libraries().directory)
    assert len({first, other_flags, *changed}) == 4
    assert built == [first, other_flags, *changed]


@pytest.mark.parametrize("tensorflow, standard", [
    (fused_op_build.TensorFlowBuild("1.15.0", ["-I/tf/include", "-D_GLIBCXX_USE_CXX11_ABI=0"],
                                    ["-L/tf", "-l:libtensorflow_framework.so.1"]), "-std=c++14"),
    (fused_op_build.TensorFlowBuild("2.15.1", ["-I/tf/include", "-D_GLIBCXX_USE_CXX11_ABI=1",
                                               "--std=c++17"], ["-L/tf"]), "--std=c++17"),
])
def test_flags_name_a_cxx_standard_the_tensorflow_was_built_with(tensorflow, standard):
    """TF 1.x names none, and g++ >= 11 would pick C++17 (see _tensorflow_flags): C++14 then."""
    version, compile_flags, link_flags = fused_op_build._tensorflow_flags(tensorflow)
    assert [flag for flag in compile_flags if "std=" in flag] == [standard]
    major, minor = version.split(".")[:2]
    assert compile_flags[-2:] == ["-DTFAMP_TF_MAJOR=" + major, "-DTFAMP_TF_MINOR=" + minor]
    assert "-isystem/tf/include" in compile_flags and link_flags == tensorflow.link_flags


def test_wheel_ships_the_sources_and_the_builder_finds_them(tmp_path, monkeypatch):
    """A non-editable install must be able to build the op on first use."""
    checkout = tmp_path / "checkout"  # a copy, so no stale build/ of the work tree leaks in
    checkout.mkdir()
    for name in ("setup.py", "README.md", "tfamp_rewrite", "custom_ops", "tfamp_rewrite_startup.py",
                 "tfamp_rewrite_startup.pth"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(str(REPO / name), str(checkout / name))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(checkout)], check=True)
    (wheel,) = tmp_path.glob("*.whl")
    zipfile.ZipFile(str(wheel)).extractall(str(tmp_path / "site"))
    site = tmp_path / "site"
    # A fresh interpreter that imports the installed copy, not this checkout.
    found = Path(subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from tfamp_rewrite.fused_op import build; print(build.op_source_dir())", str(site)],
        cwd=str(tmp_path), check=True, capture_output=True, text=True).stdout.strip())
    assert found == site / "tfamp_rewrite" / "custom_ops" / "unscale_and_check_finite"
    for op_folder in (fused_op_build.SOURCE_DIR_NAME, fused_op_build.ROUND_SOURCE_DIR_NAME):
        shipped = sorted(p.name for p in (found.parent / op_folder).iterdir())
        assert shipped == sorted(p.name for p in (fused_op_build.sources_root() / op_folder).iterdir())


# --- the CUDA toolchain --------------------------------------------------------------------

def fake_toolchain(version, archs):
    return fused_op_cuda.CudaToolchain("/opt/cuda/bin/nvcc", version, tuple(archs), "/opt/lib")


CUDA13 = fake_toolchain("13.0", [75, 80, 86, 87, 88, 89, 90, 100, 110, 103, 120, 121])
CUDA12 = fake_toolchain("12.4", [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90])


@pytest.mark.parametrize("text", ["75,80", "7.5 8.0", "sm_75;sm_80", " compute_80 , 75 "])
def test_arch_list_spellings(text):
    assert fused_op_cuda.parse_archs(text) == [75, 80]


@pytest.mark.parametrize("toolchain, archs", [(CUDA13, [75, 80, 86, 89, 90]),
                                              (CUDA12, [70, 75, 80, 86, 89, 90])])
def test_default_archs_are_what_nvcc_supports_from_volta_to_hopper(monkeypatch, toolchain, archs):
    monkeypatch.delenv(fused_op_cuda.ARCHS_ENV, raising=False)
    assert fused_op_cuda.target_archs(toolchain) == archs
    assert fused_op_cuda.gencode_flags(archs)[-1] == "-gencode=arch=compute_90,code=compute_90"


def test_only_volta_and_newer_builds_take_32kb_kernel_parameters():
    assert fused_op_cuda.kernel_parameter_flags([70, 75, 90]) == []
    assert fused_op_cuda.kernel_parameter_flags([61, 70, 80]) == [
        "-DTFAMP_KERNEL_PARAMETERS_4KB_ONLY"]


def test_v100_with_cuda13_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(fused_op_cuda.ARCHS_ENV, "70,80")
    with pytest.raises(fused_op_cuda.CudaToolchainError, match="sm_70.*V100.*CUDA 12"):
        fused_op_cuda.target_archs(CUDA13)
    monkeypatch.setenv(fused_op_cuda.ARCHS_ENV, "volta")
    with pytest.raises(fused_op_cuda.CudaToolchainError, match="not a GPU architecture"):
        fused_op_cuda.target_archs(CUDA13)


def test_nvcc_can_be_switched_off_or_pointed_at(monkeypatch, tmp_path):
    monkeypatch.setenv(fused_op_cuda.NVCC_ENV, "off")
    assert fused_op_cuda.find_cuda_toolchain() is None
    monkeypatch.setenv(fused_op_cuda.NVCC_ENV, str(tmp_path / "nvcc"))
    with pytest.raises(fused_op_cuda.CudaToolchainError, match="not an executable nvcc"):
        fused_op_cuda.find_cuda_toolchain()


def test_found_nvcc_comes_with_its_static_runtime():
    toolchain = fused_op_cuda.find_cuda_toolchain()
    if toolchain is None:
        pytest.skip("no nvcc on this machine")
    assert (Path(toolchain.cudart_static_dir) / "libcudart_static.a").is_file()
    assert toolchain.supported_archs and toolchain.version

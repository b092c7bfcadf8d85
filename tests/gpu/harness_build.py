"""Builds the kernel harness: for a GPU with nvcc, or for the CPU grid emulation with g++.

Both builds compile the op's own sources from ``custom_ops/unscale_and_check_finite/``
(``gpu_launch.cu``, ``launch_plan.cc``) with ``harness_capi.cu``; none needs TensorFlow.

* ``build_gpu(directory, archs)``: nvcc, the CUDA runtime linked statically (nvcc's
  default), ``-lineinfo`` so compute-sanitizer reports source lines. Returns the library
  and ptxas's register and spill counts of the kernel per architecture and table size.
* ``build_emulation(directory, address_sanitizer=False, arch=75, cuda_version=13000)``:
  ``$CXX`` (default g++) compiles the ``.cu`` files as C++ against
  ``emulation/cuda_runtime.h``, warnings as errors, with the device code taking the paths of
  ``sm_<arch>`` (90: bfloat16's instruction) and the toolkit's of ``cuda_version`` (11080:
  4 KB launch tables only).

nvcc is found as ``make op`` finds it (``tfamp_rewrite/fused_op/cuda_toolchain.py``, loaded
by path: it uses the standard library only), so ``TFAMP_NVCC`` and ``TFAMP_CUDA_ARCHS`` apply.
"""
from __future__ import annotations

import collections
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OP_SOURCES = REPO / "custom_ops" / "unscale_and_check_finite"
EMULATION = HERE / "emulation"
HARNESS_SOURCE = HERE / "harness_capi.cu"
GPU_LIBRARY = "libtfamp_kernel_harness_gpu.so"
EMULATION_LIBRARY = "libtfamp_kernel_harness_emulated_sm{arch}_cuda{cuda}.so"
EMULATED_CUDA_VERSION = 13000  # CUDART_VERSION of the emulated toolkit: CUDA 13.0
KERNEL_NAME = "UnscaleAndCheckFiniteKernel"

EMULATION_FLAGS = ("-std=c++14", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
                   "-Wno-unknown-pragmas", "-fno-strict-aliasing", "-ffp-contract=off")
NVCC_FLAGS = ("-O3", "-std=c++14", "-shared", "-Xcompiler", "-fPIC", "-lineinfo",
              "-Xptxas", "-v")

KernelResources = collections.namedtuple("KernelResources", "registers spill_bytes")
THREADS_PER_BLOCK = 512  # gpu_launch.cu: kThreadsPerBlock
# Per multiprocessor: (most resident threads, most resident blocks), CUDA's occupancy tables;
# every architecture here has 64K 32-bit registers per SM, allocated 256 per warp.
SM_LIMITS = {75: (1024, 16), 80: (2048, 32), 86: (1536, 16), 87: (1536, 16), 89: (1536, 24),
             90: (2048, 32), 100: (2048, 32), 103: (2048, 32), 110: (2048, 32),
             120: (1536, 32), 121: (1536, 32)}
REGISTERS_PER_SM = 65536
# The PTX conversions the kernel should contain (unscale_element.h: Cvt*).
CONVERSION_INSTRUCTIONS = ("cvt.f32.f16", "cvt.rn.f16.f32", "cvt.rn.bf16.f32")


class HarnessBuildError(RuntimeError):
    """A compiler is missing or failed; the message holds its complaint."""


def cuda_toolchain_module():
    """``tfamp_rewrite/fused_op/cuda_toolchain.py`` of this checkout, without its package."""
    path = REPO / "tfamp_rewrite" / "fused_op" / "cuda_toolchain.py"
    spec = importlib.util.spec_from_file_location("tfamp_cuda_toolchain", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find_toolchain():
    """The CudaToolchain (nvcc, version, supported archs), or None without nvcc."""
    toolchain = cuda_toolchain_module()
    try:
        return toolchain.find_cuda_toolchain()
    except toolchain.CudaToolchainError as error:
        raise HarnessBuildError(str(error)) from error


def archs_for_device(toolchain, major: int, minor: int) -> List[int]:
    """Machine code for the device when nvcc can target it, else PTX it can JIT."""
    arch = 10 * major + minor
    supported = toolchain.supported_archs
    if not supported or arch in supported:
        return [arch]
    older = [a for a in supported if a < arch]
    if not older:
        raise HarnessBuildError(
            f"nvcc {toolchain.version} cannot target sm_{arch} (it supports sm_{supported[0]} "
            f"to sm_{supported[-1]}); point TFAMP_NVCC at an nvcc that does (V100, sm_70: "
            f"CUDA 12 or older).")
    return [older[-1]]


def target_archs(toolchain) -> List[int]:
    """What ``make op`` compiles for: TFAMP_CUDA_ARCHS, or sm_75..sm_90 with CUDA 13."""
    module = cuda_toolchain_module()
    try:
        return module.target_archs(toolchain)
    except module.CudaToolchainError as error:
        raise HarnessBuildError(str(error)) from error


def gencode_flags(archs: Sequence[int]) -> List[str]:
    return cuda_toolchain_module().gencode_flags(list(archs))


def find_compute_sanitizer(nvcc: Optional[str]) -> Optional[str]:
    """compute-sanitizer beside nvcc, in $CUDA_HOME, on PATH or in /usr/local/cuda."""
    candidates = []
    if nvcc:
        bin_dir = Path(nvcc).resolve().parent
        candidates += [bin_dir / "compute-sanitizer",
                       bin_dir.parent / "compute-sanitizer" / "compute-sanitizer"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "compute-sanitizer")
    on_path = shutil.which("compute-sanitizer")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/compute-sanitizer"))
    for candidate in candidates:
        if candidate.is_file() and os.access(str(candidate), os.X_OK):
            return str(candidate)
    return None


def _run(argv: Sequence[str], cwd: Path) -> str:
    try:
        result = subprocess.run(list(argv), cwd=str(cwd), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, check=False)
    except OSError as error:
        raise HarnessBuildError(f"`{argv[0]}` does not run: {error}") from error
    if result.returncode != 0:
        raise HarnessBuildError(f"$ {' '.join(argv)}\n{result.stdout}")
    return result.stdout


def kernel_resources(ptxas_output: str) -> Dict[Tuple[str, int], KernelResources]:
    """{("sm_90", 203): KernelResources(registers, spill bytes)} of the op's kernel, per
    architecture and launch-table capacity (one kernel per table size), from ptxas -v."""
    resources, key, spills = {}, None, 0
    for line in ptxas_output.splitlines():
        entry = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+)'", line)
        if entry:
            table = re.search(r"LaunchTableILi(\d+)E", entry.group(1))
            key = ((entry.group(2), int(table.group(1)))
                   if KERNEL_NAME in entry.group(1) and table else None)
            spills = 0
            continue
        if key is None:
            continue
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if spill:
            spills = int(spill.group(1)) + int(spill.group(2))
        used = re.search(r"Used (\d+) registers", line)
        if used:
            resources[key] = KernelResources(int(used.group(1)), spills)
            key = None
    return resources


def build_gpu(directory: Path, archs: Sequence[int], toolchain=None,
              extra_flags: Sequence[str] = ()):
    """(library path, kernel_resources) of the nvcc build for ``archs`` (plus
    ``extra_flags``, e.g. a -D of a kernel variant)."""
    toolchain = toolchain or find_toolchain()
    if toolchain is None:
        raise HarnessBuildError("no nvcc found (set TFAMP_NVCC or CUDA_HOME, or put nvcc on "
                                "PATH)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / GPU_LIBRARY
    output = _run([toolchain.nvcc, *NVCC_FLAGS, *extra_flags, *gencode_flags(archs),
                   *cuda_toolchain_module().kernel_parameter_flags(archs),
                   "-I", str(OP_SOURCES),
                   str(HARNESS_SOURCE), str(OP_SOURCES / "gpu_launch.cu"),
                   str(OP_SOURCES / "launch_plan.cc"), "-o", str(library)], directory)
    return library, kernel_resources(output)


def occupancy(arch: int, registers: int, threads: int = THREADS_PER_BLOCK):
    """(resident blocks per SM, share of the SM's threads) of a kernel using ``registers``
    per thread, from the architecture's limits (None for an architecture not in the table)."""
    if arch not in SM_LIMITS:
        return None
    max_threads, max_blocks = SM_LIMITS[arch]
    warps = -(-threads // 32)
    registers_per_warp = -(-registers * 32 // 256) * 256
    by_registers = REGISTERS_PER_SM // registers_per_warp // warps
    blocks = min(by_registers, max_threads // threads, max_blocks)
    return blocks, blocks * threads / max_threads


def conversion_instructions(archs: Sequence[int], toolchain=None) -> Dict[int, Dict[str, int]]:
    """{arch: {instruction: count}} in the kernel's PTX for each architecture: shows which
    conversions each build uses (sm_75: no cvt.rn.bf16.f32, the portable rounding instead)."""
    toolchain = toolchain or find_toolchain()
    counts = {}
    with tempfile.TemporaryDirectory(prefix="tfamp-ptx-") as scratch:
        for arch in archs:
            ptx = Path(scratch) / f"kernel_{arch}.ptx"
            _run([toolchain.nvcc, "-std=c++14", "-ptx", f"-arch=compute_{arch}",
                  *cuda_toolchain_module().kernel_parameter_flags([arch]), "-I",
                  str(OP_SOURCES), str(OP_SOURCES / "gpu_launch.cu"), "-o", str(ptx)],
                 Path(scratch))
            text = ptx.read_text()
            counts[arch] = {name: len(re.findall(re.escape(name) + r"\s", text))
                            for name in CONVERSION_INSTRUCTIONS}
    return counts


def build_emulation(directory: Path, address_sanitizer: bool = False, arch: int = 75,
                    cuda_version: int = EMULATED_CUDA_VERSION) -> Path:
    """The harness against the grid emulation of an ``sm_<arch>`` device, compiled by ``$CXX``
    as if by the nvcc of ``cuda_version`` (11080: CUDA 11.8, whose kernels take no
    parameters over 4 KB)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / EMULATION_LIBRARY.format(arch=arch, cuda=cuda_version)
    if address_sanitizer:
        optimise = ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"]
    else:
        optimise = ["-O2"]
    _run([os.environ.get("CXX", "g++"), *EMULATION_FLAGS, *optimise,
          f"-DTFAMP_EMULATED_CUDA_ARCH={10 * arch}",
          f"-DTFAMP_EMULATED_CUDART_VERSION={cuda_version}",
          "-I", str(EMULATION), "-I", str(OP_SOURCES),
          "-x", "c++", str(OP_SOURCES / "gpu_launch.cu"), str(HARNESS_SOURCE),
          "-x", "none", str(OP_SOURCES / "launch_plan.cc"), str(EMULATION / "emulation_capi.cc"),
          "-o", str(library)], directory)
    return library

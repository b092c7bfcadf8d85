"""The CUDA toolchain the fused op's GPU kernel is compiled with: which nvcc, which GPUs.

``find_cuda_toolchain()`` looks for nvcc, in this order:

1. ``TFAMP_NVCC``: a path to nvcc, or ``off`` to build the CPU-only library;
2. ``$CUDA_HOME/bin/nvcc``, ``$CUDA_PATH/bin/nvcc``;
3. ``nvcc`` on ``PATH``;
4. the PyPI wheels (``pip install nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt
   nvidia-cuda-runtime``), i.e. ``site-packages/nvidia/cu*/bin/nvcc``;
5. ``/usr/local/cuda/bin/nvcc``.

``TFAMP_CUDA_ARCHS`` (e.g. ``"75,80,86"``) picks the GPU architectures; by default every
architecture from Volta to Hopper that the nvcc supports (CUDA 13: sm_75 ... sm_90; V100,
sm_70, needs a CUDA 12 or older nvcc), plus PTX of the newest for later GPUs.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

NVCC_ENV = "TFAMP_NVCC"
ARCHS_ENV = "TFAMP_CUDA_ARCHS"
DEFAULT_ARCHS = (70, 75, 80, 86, 89, 90)
_OFF_VALUES = ("off", "0", "no", "none", "false")  # "" is not off: it means "search"


class CudaToolchainError(RuntimeError):
    """nvcc was found (or asked for) but cannot build the GPU kernel as configured."""


class CudaToolchain(collections.namedtuple(
        "CudaToolchain", "nvcc version supported_archs cudart_static_dir")):
    """An nvcc (path), its CUDA version ("13.0"), the real architectures it can target
    (sorted ints, e.g. (75, 80, ...)), and the directory holding libcudart_static.a."""

    __slots__ = ()

    @property
    def identity(self) -> str:
        """What a cached build depends on."""
        return f"nvcc {self.version} at {self.nvcc}"


def _run(argv) -> str:
    result = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, check=False)
    if result.returncode != 0:
        raise CudaToolchainError(f"`{' '.join(argv)}` failed:\n{result.stdout}")
    return result.stdout


def _nvcc_candidates():
    candidates = [Path(os.environ[var]) / "bin" / "nvcc"
                  for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    for entry in sys.path:  # PyPI wheels
        candidates.extend(sorted(Path(entry or ".").glob("nvidia/cu*/bin/nvcc")))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    return candidates


def _find_nvcc():
    """The nvcc to use (a path string), or None."""
    requested = os.environ.get(NVCC_ENV, "").strip()
    if requested.lower() in _OFF_VALUES:
        return None
    if requested:
        if not os.access(requested, os.X_OK):
            raise CudaToolchainError(f"{NVCC_ENV}={requested} is not an executable nvcc; "
                                     f"point it at one or set {NVCC_ENV}=off.")
        return requested
    for candidate in _nvcc_candidates():
        if candidate.is_file() and os.access(str(candidate), os.X_OK):
            return str(candidate)
    return None


def _cudart_static_dir(nvcc: str) -> str:
    """nvcc's own library directories (from --dryrun), then the usual ones beside it."""
    dryrun = _run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
    dirs = []
    for line in dryrun.splitlines():
        if "LIBRARIES=" in line:
            dirs.extend(re.findall(r'-L"?([^" ]+)', line))
    top = Path(nvcc).resolve().parent.parent
    dirs.extend(str(top / sub) for sub in ("lib64", "lib"))
    dirs.extend(str(p) for p in sorted(top.glob("targets/*/lib")))
    for directory in dirs:
        if (Path(directory) / "libcudart_static.a").is_file():
            return directory
    raise CudaToolchainError(
        f"libcudart_static.a not found for {nvcc} (searched {', '.join(dirs)}); install the "
        f"CUDA runtime (e.g. pip install nvidia-cuda-runtime) or set {NVCC_ENV}=off.")


def find_cuda_toolchain():
    """The CudaToolchain to build the GPU kernel with, or None without nvcc (or when off)."""
    nvcc = _find_nvcc()
    if nvcc is None:
        return None
    version = re.search(r"release (\d+\.\d+)", _run([nvcc, "--version"]))
    if version is None:
        raise CudaToolchainError(f"cannot read the CUDA version from `{nvcc} --version`.")
    try:
        listed = _run([nvcc, "--list-gpu-arch"])
    except CudaToolchainError:  # nvcc older than CUDA 11 cannot list them
        listed = ""
    supported = tuple(sorted({int(a) for a in re.findall(r"compute_(\d+)", listed)}))
    return CudaToolchain(nvcc, version.group(1), supported, _cudart_static_dir(nvcc))


def parse_archs(text: str):
    """``"75,80"``, ``"7.5 8.0"`` or ``"sm_75;sm_80"`` -> ``[75, 80]``."""
    archs = []
    for item in re.split(r"[\s,;]+", text.strip()):
        match = re.fullmatch(r"(?:sm_|compute_)?(\d)\.?(\d+)", item)
        if match is None:
            raise CudaToolchainError(f"{ARCHS_ENV}={text!r}: {item!r} is not a GPU architecture; "
                                     "use numbers like 75,80,86.")
        archs.append(int(match.group(1) + match.group(2)))
    return sorted(set(archs))


def target_archs(toolchain):
    """The architectures to compile for (sorted ints): ``TFAMP_CUDA_ARCHS`` or the defaults."""
    supported = toolchain.supported_archs
    requested = os.environ.get(ARCHS_ENV, "").strip()
    if requested:
        archs = parse_archs(requested)
        unsupported = [a for a in archs if supported and a not in supported]
        if unsupported:
            raise CudaToolchainError(
                f"nvcc {toolchain.version} cannot target "
                f"{', '.join(f'sm_{a}' for a in unsupported)} (it supports sm_{supported[0]} "
                f"to sm_{supported[-1]}). V100 (sm_70) needs CUDA 12 or older: point "
                f"{NVCC_ENV} at such an nvcc, or drop the architecture from {ARCHS_ENV}.")
        return archs
    archs = [a for a in DEFAULT_ARCHS if a in supported]
    if not archs:
        raise CudaToolchainError(
            f"nvcc {toolchain.version} lists none of sm_{', sm_'.join(map(str, DEFAULT_ARCHS))}; "
            f"set {ARCHS_ENV} to the architectures you need, e.g. {ARCHS_ENV}=70,75.")
    return archs


def gencode_flags(archs):
    """Machine code for every arch, plus PTX of the newest so later GPUs can JIT it."""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return flags


LARGE_KERNEL_PARAMETERS_MIN_ARCH = 70


def kernel_parameter_flags(archs):
    """``-DTFAMP_KERNEL_PARAMETERS_4KB_ONLY`` when an architecture below Volta is built: only
    Volta and newer take kernel parameters over 4 KB, so ``gpu_launch.cu`` then compiles its
    4 KB launch tables only (on any nvcc; an nvcc before CUDA 12.1 does so by itself)."""
    if min(archs) < LARGE_KERNEL_PARAMETERS_MIN_ARCH:
        return ["-DTFAMP_KERNEL_PARAMETERS_4KB_ONLY"]
    return []

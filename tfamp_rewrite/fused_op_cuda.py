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

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

NVCC_ENV = "TFAMP_NVCC"
ARCHS_ENV = "TFAMP_CUDA_ARCHS"
DEFAULT_ARCHS = (70, 75, 80, 86, 89, 90)
_OFF_VALUES = ("off", "0", "no", "none", "false")  # "" is not off: it means "search"


class CudaToolchainError(RuntimeError):
    """nvcc was found (or asked for) but cannot build the GPU kernel as configured."""


@dataclass(frozen=True)
class CudaToolchain:
    """An nvcc, what it can target, and where its static CUDA runtime lives."""

    nvcc: str
    version: str  # e.g. "13.0"
    supported_archs: Tuple[int, ...]  # real architectures nvcc can target, e.g. (75, 80, ...)
    cudart_static_dir: str  # the directory holding libcudart_static.a

    @property
    def identity(self) -> str:
        """What a cached build depends on."""
        return "nvcc %s at %s" % (self.version, self.nvcc)


def _run(argv: Sequence[str]) -> str:
    result = subprocess.run(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
        universal_newlines=True,
    )
    if result.returncode != 0:
        raise CudaToolchainError("`%s` failed:\n%s" % (" ".join(argv), result.stdout))
    return result.stdout


def _wheel_nvccs() -> List[Path]:
    found = []
    for entry in sys.path:
        found.extend(sorted(Path(entry or ".").glob("nvidia/cu*/bin/nvcc")))
    return found


def _nvcc_candidates() -> List[Path]:
    candidates = [
        Path(os.environ[var]) / "bin" / "nvcc"
        for var in ("CUDA_HOME", "CUDA_PATH")
        if os.environ.get(var)
    ]
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.extend(_wheel_nvccs())
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    return candidates


def _find_nvcc() -> Optional[str]:
    requested = os.environ.get(NVCC_ENV, "").strip()
    if requested.lower() in _OFF_VALUES:
        return None
    if requested:
        if not os.access(requested, os.X_OK):
            raise CudaToolchainError(
                "%s=%s is not an executable nvcc; point it at one or set %s=off."
                % (NVCC_ENV, requested, NVCC_ENV)
            )
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
        "libcudart_static.a not found for %s (searched %s); install the CUDA runtime "
        "(e.g. pip install nvidia-cuda-runtime) or set %s=off." % (nvcc, ", ".join(dirs), NVCC_ENV)
    )


def find_cuda_toolchain() -> Optional[CudaToolchain]:
    """The toolchain to build the GPU kernel with, or None when there is no nvcc (or it is off)."""
    nvcc = _find_nvcc()
    if nvcc is None:
        return None
    version = re.search(r"release (\d+\.\d+)", _run([nvcc, "--version"]))
    if version is None:
        raise CudaToolchainError("cannot read the CUDA version from `%s --version`." % nvcc)
    try:
        listed = _run([nvcc, "--list-gpu-arch"])
    except CudaToolchainError:  # nvcc older than CUDA 11 cannot list them
        listed = ""
    supported = tuple(sorted({int(a) for a in re.findall(r"compute_(\d+)", listed)}))
    return CudaToolchain(nvcc, version.group(1), supported, _cudart_static_dir(nvcc))


def parse_archs(text: str) -> List[int]:
    """``"75,80"``, ``"7.5 8.0"`` or ``"sm_75;sm_80"`` -> ``[75, 80]``."""
    archs = []
    for item in re.split(r"[\s,;]+", text.strip()):
        match = re.fullmatch(r"(?:sm_|compute_)?(\d)\.?(\d+)", item)
        if match is None:
            raise CudaToolchainError(
                "%s=%r: %r is not a GPU architecture; use numbers like 75,80,86."
                % (ARCHS_ENV, text, item)
            )
        archs.append(int(match.group(1) + match.group(2)))
    return sorted(set(archs))


def target_archs(toolchain: CudaToolchain) -> List[int]:
    """The architectures to compile for: ``TFAMP_CUDA_ARCHS`` or the supported defaults."""
    requested = os.environ.get(ARCHS_ENV, "").strip()
    if not requested:
        if not toolchain.supported_archs:
            raise CudaToolchainError(
                "nvcc %s cannot list its GPU architectures; set %s, e.g. %s=70,75."
                % (toolchain.version, ARCHS_ENV, ARCHS_ENV)
            )
        archs = [a for a in DEFAULT_ARCHS if a in toolchain.supported_archs]
        if not archs:
            raise CudaToolchainError(
                "nvcc %s supports none of sm_%s; set %s to the architectures you need."
                % (toolchain.version, ", sm_".join(map(str, DEFAULT_ARCHS)), ARCHS_ENV)
            )
        return archs
    archs = parse_archs(requested)
    unsupported = [a for a in archs if toolchain.supported_archs and a not in toolchain.supported_archs]
    if unsupported:
        raise CudaToolchainError(
            "nvcc %s cannot target %s (it supports sm_%s to sm_%s). V100 (sm_70) needs CUDA 12 "
            "or older: point %s at such an nvcc, or drop the architecture from %s."
            % (
                toolchain.version, ", ".join("sm_%d" % a for a in unsupported),
                toolchain.supported_archs[0], toolchain.supported_archs[-1], NVCC_ENV, ARCHS_ENV,
            )
        )
    return archs


def gencode_flags(archs: Sequence[int]) -> List[str]:
    """Machine code for every arch, plus PTX of the newest so later GPUs can JIT it."""
    flags = ["-gencode=arch=compute_%d,code=sm_%d" % (a, a) for a in archs]
    flags.append("-gencode=arch=compute_%d,code=compute_%d" % (archs[-1], archs[-1]))
    return flags

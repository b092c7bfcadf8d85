"""Builds the fused ``UnscaleAndCheckFinite`` op library, cached per TensorFlow and toolchain.

``python -m tfamp_rewrite.fused_op_build [--force]`` (what ``make op`` runs) builds

* the CPU library: op definition and CPU kernel, compiled by ``$CXX`` (default g++) with
  ``tf.sysconfig``'s flags;
* the GPU library: the same plus the CUDA kernel, whenever an nvcc is found (see
  ``fused_op_cuda``); the CUDA runtime is linked statically, so it also loads on
  tensorflow-cpu (the GPU kernel is then registered but never used).

``library_path()`` is the library to load (the GPU one when built); it builds on first use.
Builds are cached under ``$TFAMP_OP_CACHE`` (default ``~/.cache/tfamp_rewrite``), one
directory per hash of everything that goes into them: TensorFlow version and flags,
compilers, commands and source bytes. A failed GPU build is remembered there as well (its
log beside the CPU library) until one of those changes or ``--force`` is given.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from tfamp_rewrite import fused_op_cuda

SOURCE_DIR_NAME = "unscale_and_check_finite"
CACHE_ENV = "TFAMP_OP_CACHE"
CPU_LIBRARY = "libtfamp_unscale_cpu.so"
GPU_LIBRARY = "libtfamp_unscale_gpu.so"
GPU_ERROR_LOG = "gpu_build_error.log"

# -ffp-contract=off: no FMA, so g * inv_scale rounds exactly as TensorFlow's Mul does.
# -fno-trapping-math: lets GCC if-convert and vectorise the branch-free selects.
CXX_FLAGS = ("-O3", "-fPIC", "-Wall", "-fvisibility=hidden", "-ffp-contract=off",
             "-fno-trapping-math")
NVCC_FLAGS = ("-O3", "-std=c++14", "-Xcompiler", "-fPIC,-fvisibility=hidden")
CPU_SOURCES = ("op_def.cc", "cpu_kernel.cc", "launch_plan.cc")
GPU_SOURCES = ("gpu_kernel.cc", "gpu_launch.cu")


class FusedOpBuildError(RuntimeError):
    """The CPU library could not be built; the message holds the compiler's complaint."""


@dataclass(frozen=True)
class Libraries:
    """The outcome of a (possibly cached) build."""

    directory: Path
    cpu: Path
    gpu: Optional[Path]
    gpu_skipped: Optional[str] = None  # legitimately no GPU library, e.g. no nvcc found
    gpu_error: Optional[str] = None  # nvcc was there but the GPU build failed

    @property
    def preferred(self) -> Path:
        """The library to load: the GPU one holds the CPU kernel too."""
        return self.gpu or self.cpu


@dataclass(frozen=True)
class _Step:
    argv: Tuple[str, ...]
    output: str
    gpu: bool


def op_source_dir() -> Path:
    """The op's C++/CUDA sources: package data when installed, ``custom_ops/`` in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "custom_ops" / SOURCE_DIR_NAME,
                      here.parent / "custom_ops" / SOURCE_DIR_NAME):
        if (candidate / "op_def.cc").is_file():
            return candidate
    raise FusedOpBuildError(
        "the UnscaleAndCheckFinite sources are missing (looked in %s/custom_ops and "
        "%s/custom_ops); reinstall tfamp_rewrite." % (here, here.parent)
    )


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "tfamp_rewrite"


def _tensorflow_flags() -> Tuple[str, List[str], List[str]]:
    """(version, compile flags, link flags); TF's headers as system headers (no warnings)."""
    import tensorflow as tf

    compile_flags = [
        "-isystem" + flag[2:] if flag.startswith("-I") else flag
        for flag in tf.sysconfig.get_compile_flags()
    ]
    return tf.__version__, compile_flags, list(tf.sysconfig.get_link_flags())


def _first_line_of(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             check=True, universal_newlines=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise FusedOpBuildError("C++ compiler `%s` does not run (%s); install g++ or set CXX."
                                % (argv[0], e)) from e
    return out.splitlines()[0] if out else argv[0]


def _plan(src: Path, cxx: str, tf_compile: List[str], tf_link: List[str],
          cuda: Optional[fused_op_cuda.CudaToolchain], archs: List[int]) -> List[_Step]:
    """The compiler invocations, relative to the build directory (compiles come first)."""
    steps = []
    cxx_compile = [cxx, *CXX_FLAGS, *tf_compile, "-c"]
    for name in CPU_SOURCES + (GPU_SOURCES[:1] if cuda else ()):
        obj = name.rsplit(".", 1)[0] + ".o"
        steps.append(_Step((*cxx_compile, str(src / name), "-o", obj), obj, name in GPU_SOURCES))
    cpu_objs = [s.output for s in steps if not s.gpu]
    if cuda:
        abi = [f for f in tf_compile if f.startswith("-D_GLIBCXX_USE_CXX11_ABI")]
        steps.append(_Step(
            (cuda.nvcc, *NVCC_FLAGS, *abi, *fused_op_cuda.gencode_flags(archs), "-c",
             str(src / GPU_SOURCES[1]), "-o", "gpu_launch.o"), "gpu_launch.o", True))
    steps.append(_Step((cxx, "-shared", *cpu_objs, "-o", CPU_LIBRARY, *tf_link), CPU_LIBRARY,
                       False))
    if cuda:
        gpu_objs = cpu_objs + [s.output for s in steps if s.gpu]
        # Static cudart first and hidden: TF's own libraries may export cudart stubs.
        cudart = ["-L" + cuda.cudart_static_dir, "-Wl,--exclude-libs,libcudart_static.a",
                  "-l:libcudart_static.a", "-ldl", "-lrt", "-lpthread"]
        steps.append(_Step((cxx, "-shared", *gpu_objs, "-o", GPU_LIBRARY, *cudart, *tf_link),
                           GPU_LIBRARY, True))
    return steps


def _sources_digest(src: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in src.iterdir() if p.suffix in (".h", ".cc", ".cu")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _run_step(step: _Step, cwd: Path) -> Tuple[_Step, int, str]:
    result = subprocess.run(step.argv, cwd=str(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    return step, result.returncode, "$ %s\n%s" % (" ".join(step.argv), result.stdout)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _execute(steps: List[_Step], workdir: Path) -> Optional[str]:
    """Runs the steps in ``workdir``; returns the GPU build's error, if that part failed.

    Raises FusedOpBuildError when the CPU library cannot be built.
    """
    log = []
    gpu_errors = []

    def record(results):
        for step, code, output in results:
            log.append(output)
            if code != 0 and not step.gpu:
                raise FusedOpBuildError("building the fused op failed:\n" + _tail(output))
            if code != 0:
                gpu_errors.append(_tail(output))

    compiles = [s for s in steps if not s.output.endswith(".so")]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(2, os.cpu_count() or 1))) as pool:
        record(pool.map(lambda s: _run_step(s, workdir), compiles))
    for link in (s for s in steps if s.output.endswith(".so")):
        if not (link.gpu and gpu_errors):
            record([_run_step(link, workdir)])
    (workdir / "build.log").write_text("\n".join(log))
    if gpu_errors:
        (workdir / GPU_ERROR_LOG).write_text("\n".join(gpu_errors))
        return "\n".join(gpu_errors)
    return None


def _gpu_toolchain() -> Tuple[Optional[fused_op_cuda.CudaToolchain], List[int], Optional[str],
                              Optional[str]]:
    """(toolchain, archs, why skipped, error): at most one of the last two is set."""
    try:
        cuda = fused_op_cuda.find_cuda_toolchain()
        if cuda is None:
            return None, [], "no nvcc found (set %s or CUDA_HOME)" % fused_op_cuda.NVCC_ENV, None
        return cuda, fused_op_cuda.target_archs(cuda), None, None
    except fused_op_cuda.CudaToolchainError as e:
        return None, [], None, str(e)


def _build_into(directory: Path, steps: List[_Step]) -> None:
    """Builds in a scratch directory beside ``directory`` and renames it into place."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=directory.name + ".building-", dir=str(directory.parent)))
    try:
        _execute(steps, workdir)
        if not directory.exists():  # else a concurrent build finished first: keep that one
            os.rename(str(workdir), str(directory))
    finally:
        shutil.rmtree(str(workdir), ignore_errors=True)


def build_libraries(force: bool = False) -> Libraries:
    """The op libraries for the installed TensorFlow, built unless a cached build exists."""
    src = op_source_dir()
    cxx = os.environ.get("CXX", "g++")
    tf_version, tf_compile, tf_link = _tensorflow_flags()
    cuda, archs, gpu_skipped, gpu_error = _gpu_toolchain()
    steps = _plan(src, cxx, tf_compile, tf_link, cuda, archs)
    identity = {
        "tensorflow": tf_version,
        "cxx": _first_line_of([cxx, "--version"]),
        "nvcc": cuda.identity if cuda else None,
        "steps": [step.argv for step in steps],
        "sources": _sources_digest(src),
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    directory = cache_root() / SOURCE_DIR_NAME / ("tf%s-%s" % (tf_version, key))
    if force and directory.exists():
        shutil.rmtree(str(directory))
    if not (directory / CPU_LIBRARY).is_file():
        _build_into(directory, steps)
    gpu = directory / GPU_LIBRARY
    if cuda and not gpu.is_file():
        gpu_error = (directory / GPU_ERROR_LOG).read_text()
    return Libraries(directory, directory / CPU_LIBRARY, gpu if gpu.is_file() else None,
                     gpu_skipped, gpu_error)


def library_path() -> Path:
    """The library ``tf.load_op_library`` should load, built now if not cached yet."""
    return build_libraries().preferred


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfamp_rewrite.fused_op_build",
        description="Build (or find cached) the fused UnscaleAndCheckFinite op libraries.",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    start = time.time()
    try:
        libs = build_libraries(force=args.force)
    except (FusedOpBuildError, OSError) as e:
        print("tfamp_rewrite: %s" % e, file=sys.stderr)
        return 1
    print("tfamp_rewrite: UnscaleAndCheckFinite libraries in %s (%.1f s)"
          % (libs.directory, time.time() - start))
    print("  cpu: %s" % libs.cpu.name)
    print("  gpu: %s" % (libs.gpu.name if libs.gpu else "not built: %s"
                         % (libs.gpu_skipped or "failed")))
    import tensorflow as tf

    try:
        tf.load_op_library(str(libs.preferred))
    except tf.errors.OpError as e:
        print("tfamp_rewrite: %s does not load: %s" % (libs.preferred, e), file=sys.stderr)
        return 1
    if libs.gpu_error:
        print("tfamp_rewrite: the GPU library failed to build (the CPU one works):\n%s"
              % libs.gpu_error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

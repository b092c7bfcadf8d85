"""Builds the op library (``UnscaleAndCheckFinite``, ``RoundToHalf``), cached per TensorFlow and toolchain.

``python -m tfamp_rewrite.fused_op.build [--force]`` (what ``make op`` runs) builds, from
``custom_ops/unscale_and_check_finite/`` and ``custom_ops/round_to_half/``,

* the CPU library: both ops' definitions and CPU kernels, compiled by ``$CXX`` (default
  g++) with ``tf.sysconfig``'s flags;
* the GPU library: the same plus UnscaleAndCheckFinite's CUDA kernel, whenever an nvcc is
  found (see ``cuda_toolchain``); the CUDA runtime is linked statically, so it also loads
  on tensorflow-cpu (the GPU kernel is then registered but never used).  RoundToHalf has
  a CPU kernel only.

``build_libraries().preferred`` is the library to load (the GPU one when built); the
first call builds it.  ``build_libraries(tensorflow=TensorFlowBuild(...))`` builds against
another TensorFlow than the installed one, from what its ``tf.sysconfig`` says (how the
tests build against TensorFlow 1.15's headers and framework library).
Builds are cached under ``$TFAMP_OP_CACHE`` (default ``~/.cache/tfamp_rewrite``), one
directory per hash of everything that goes into them: TensorFlow version and flags,
compilers, commands and source bytes. A failed GPU build is remembered there as well (its
log beside the CPU library) until one of those changes or ``--force`` is given.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..user_log import log_info
from . import cuda_toolchain

SOURCE_DIR_NAME = "unscale_and_check_finite"
ROUND_SOURCE_DIR_NAME = "round_to_half"
CACHE_ENV = "TFAMP_OP_CACHE"
CPU_LIBRARY = "libtfamp_unscale_cpu.so"
GPU_LIBRARY = "libtfamp_unscale_gpu.so"
GPU_ERROR_LOG = "gpu_build_error.log"

# -ffp-contract=off: no FMA, so g * inv_scale rounds exactly as TensorFlow's Mul does.
# -fno-trapping-math: lets GCC if-convert and vectorise the branch-free selects.
CXX_FLAGS = ("-O3", "-fPIC", "-Wall", "-fvisibility=hidden", "-ffp-contract=off",
             "-fno-trapping-math")
NVCC_FLAGS = ("-O3", "-std=c++14", "-Xcompiler", "-fPIC,-fvisibility=hidden")
# Paths under custom_ops/.
CPU_SOURCES = tuple("%s/%s" % (folder, name) for folder, names in (
    (SOURCE_DIR_NAME, ("op_def.cc", "cpu_kernel.cc", "launch_plan.cc")),
    (ROUND_SOURCE_DIR_NAME, ("op_def.cc", "cpu_kernel.cc"))) for name in names)
GPU_HOST_SOURCE = SOURCE_DIR_NAME + "/gpu_kernel.cc"
GPU_DEVICE_SOURCE = SOURCE_DIR_NAME + "/gpu_launch.cu"


class FusedOpBuildError(RuntimeError):
    """The CPU library could not be built; the message holds the compiler's complaint."""


class Libraries(collections.namedtuple(
        "Libraries", "directory cpu gpu gpu_skipped gpu_error")):
    """A (possibly cached) build: its directory, the CPU library path, the GPU library path
    or None, and why there is no GPU library: ``gpu_skipped`` when that is legitimate (no
    nvcc), ``gpu_error`` when nvcc was there but the GPU build failed."""

    __slots__ = ()

    @property
    def preferred(self) -> Path:
        """The library to load: the GPU one holds the CPU kernel too."""
        return self.gpu or self.cpu


# One compiler run: argv (relative to the build directory), its output file, and whether it
# belongs to the GPU library only (so its failure leaves the CPU library usable).
_Step = collections.namedtuple("_Step", "argv output gpu")


def sources_root() -> Path:
    """``custom_ops/``, holding one folder per op: package data when installed, the
    checkout's ``custom_ops/`` otherwise."""
    package = Path(__file__).resolve().parent.parent  # tfamp_rewrite/
    for candidate in (package / "custom_ops", package.parent / "custom_ops"):
        if all((candidate / source).is_file() for source in CPU_SOURCES):
            return candidate
    raise FusedOpBuildError(f"the op sources are missing (looked in {package}/custom_ops and "
                            f"{package.parent}/custom_ops); reinstall tfamp_rewrite.")


def op_source_dir() -> Path:
    """The UnscaleAndCheckFinite op's C++/CUDA sources (``custom_ops/unscale_and_check_finite``)."""
    return sources_root() / SOURCE_DIR_NAME


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "tfamp_rewrite"


class TensorFlowBuild(collections.namedtuple("TensorFlowBuild", "version compile_flags link_flags")):
    """A TensorFlow to build against: ``tf.__version__``, ``tf.sysconfig.get_compile_flags()``
    and ``tf.sysconfig.get_link_flags()`` as that TensorFlow reports them."""

    __slots__ = ()


def installed_tensorflow() -> TensorFlowBuild:
    """The TensorFlow this Python imports."""
    import tensorflow as tf

    return TensorFlowBuild(tf.__version__, list(tf.sysconfig.get_compile_flags()),
                           list(tf.sysconfig.get_link_flags()))


def _tensorflow_flags(tensorflow: TensorFlowBuild):
    """(version, compile flags, link flags); TF's headers as system headers (no warnings).

    The TensorFlow version is passed as TFAMP_TF_MAJOR / TFAMP_TF_MINOR: newer headers no
    longer define TF_MAJOR_VERSION themselves (their build system does).  TF 1.x names no
    C++ standard; it was built as C++14, and a compiler defaulting to C++17 (g++ >= 11)
    would turn absl::string_view into std::string_view in its headers, so the library
    would not load (undefined tensorflow::Status(Code, std::string_view)).
    """
    compile_flags = ["-isystem" + flag[2:] if flag.startswith("-I") else flag
                     for flag in tensorflow.compile_flags]
    if not any(flag.startswith(("-std=", "--std=")) for flag in compile_flags):
        compile_flags.insert(0, "-std=c++14")
    major, minor = tensorflow.version.split(".")[:2]
    compile_flags += ["-DTFAMP_TF_MAJOR=%d" % int(major), "-DTFAMP_TF_MINOR=%d" % int(minor)]
    return tensorflow.version, compile_flags, list(tensorflow.link_flags)


def _compiler_identity(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise FusedOpBuildError(f"C++ compiler `{cxx}` does not run ({e}); install g++ or "
                                "set CXX.") from e
    return out.splitlines()[0] if out else cxx


def _plan(src, cxx, tf_compile, tf_link, cuda, archs):
    """The _Steps of a build, compiles first; the GPU ones only when ``cuda`` is given."""
    def compile_cxx(source, gpu):
        obj = _object_name(source)
        return _Step((cxx, *CXX_FLAGS, *tf_compile, "-c", str(src / source), "-o", obj), obj, gpu)

    steps = [compile_cxx(name, False) for name in CPU_SOURCES]
    cpu_objects = [s.output for s in steps]
    link_cpu = _Step((cxx, "-shared", *cpu_objects, "-o", CPU_LIBRARY, *tf_link), CPU_LIBRARY,
                     False)
    if not cuda:
        return steps + [link_cpu]
    abi = [f for f in tf_compile if f.startswith("-D_GLIBCXX_USE_CXX11_ABI")]
    gpu_steps = [
        compile_cxx(GPU_HOST_SOURCE, True),
        _Step((cuda.nvcc, *NVCC_FLAGS, *abi, *cuda_toolchain.gencode_flags(archs),
               *cuda_toolchain.kernel_parameter_flags(archs), "-c",
               str(src / GPU_DEVICE_SOURCE), "-o", _object_name(GPU_DEVICE_SOURCE)),
              _object_name(GPU_DEVICE_SOURCE), True),
    ]
    # Static cudart first and hidden: TF's own libraries may export cudart stubs.
    cudart = ("-L" + cuda.cudart_static_dir, "-Wl,--exclude-libs,libcudart_static.a",
              "-l:libcudart_static.a", "-ldl", "-lrt", "-lpthread")
    link_gpu = _Step((cxx, "-shared", *cpu_objects, *(s.output for s in gpu_steps), "-o",
                      GPU_LIBRARY, *cudart, *tf_link), GPU_LIBRARY, True)
    return steps + gpu_steps + [link_cpu, link_gpu]


def _object_name(source: str) -> str:
    """``round_to_half/op_def.cc`` -> ``round_to_half-op_def.o`` (one folder for all objects)."""
    return source.rsplit(".", 1)[0].replace("/", "-") + ".o"


def _sources_digest(src: Path) -> str:
    """A hash of every source in every op folder under ``src`` (``custom_ops/``)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in src.glob("*/*") if p.suffix in (".h", ".cc", ".cu")):
        digest.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _run_step(step, cwd: Path):
    result = subprocess.run(step.argv, cwd=str(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, check=False)
    return step, result.returncode, f"$ {' '.join(step.argv)}\n{result.stdout}"


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _execute(steps, workdir: Path):
    """Runs the steps in ``workdir``; returns the GPU build's error text, or None.

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
    if not gpu_errors:
        return None
    (workdir / GPU_ERROR_LOG).write_text("\n".join(gpu_errors))
    return "\n".join(gpu_errors)


def _gpu_toolchain():
    """(CudaToolchain or None, archs, why skipped, error): at most one of the last two set."""
    try:
        cuda = cuda_toolchain.find_cuda_toolchain()
        if cuda is None:
            return None, [], f"no nvcc found (set {cuda_toolchain.NVCC_ENV} or CUDA_HOME)", None
        return cuda, cuda_toolchain.target_archs(cuda), None, None
    except cuda_toolchain.CudaToolchainError as e:
        return None, [], None, str(e)


def _build_into(directory: Path, steps) -> None:
    """Builds in a scratch directory beside ``directory`` and renames it into place."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=directory.name + ".building-", dir=str(directory.parent)))
    try:
        _execute(steps, workdir)
        if not directory.exists():  # else a concurrent build finished first: keep that one
            os.rename(str(workdir), str(directory))
    finally:
        shutil.rmtree(str(workdir), ignore_errors=True)


def build_libraries(force: bool = False, tensorflow: TensorFlowBuild = None) -> Libraries:
    """The op libraries for ``tensorflow`` (default: the installed one), built unless a
    cached build exists."""
    src = sources_root()
    cxx = os.environ.get("CXX", "g++")
    tf_version, tf_compile, tf_link = _tensorflow_flags(tensorflow or installed_tensorflow())
    cuda, archs, gpu_skipped, gpu_error = _gpu_toolchain()
    steps = _plan(src, cxx, tf_compile, tf_link, cuda, archs)
    identity = {
        "tensorflow": tf_version,
        "cxx": _compiler_identity(cxx),
        "nvcc": cuda.identity if cuda else None,
        # Where the sources lie is not part of what is built: the editable checkout and a
        # wheel installed from it share one build (the digest says the sources are the same).
        "steps": [[arg.replace(str(src), "<sources>") for arg in step.argv] for step in steps],
        "sources": _sources_digest(src),
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    directory = cache_root() / SOURCE_DIR_NAME / f"tf{tf_version}-{key}"
    if force and directory.exists():
        shutil.rmtree(str(directory))
    if not (directory / CPU_LIBRARY).is_file():
        log_info("tfamp_rewrite: building the op libraries (UnscaleAndCheckFinite, RoundToHalf) "
                 "into %s: the first use with this TensorFlow, compiler and sources; about a "
                 "minute, several with nvcc" % directory)
        _build_into(directory, steps)
    gpu = directory / GPU_LIBRARY
    if cuda and not gpu.is_file():
        error_log = directory / GPU_ERROR_LOG
        gpu_error = error_log.read_text() if error_log.is_file() else f"{gpu} is missing"
    return Libraries(directory, directory / CPU_LIBRARY, gpu if gpu.is_file() else None,
                     gpu_skipped, gpu_error)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfamp_rewrite.fused_op.build",
        description="Build (or find cached) the op libraries (UnscaleAndCheckFinite, RoundToHalf).")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    start = time.time()
    try:
        libs = build_libraries(force=args.force)
    except (FusedOpBuildError, OSError) as e:
        print(f"tfamp_rewrite: {e}", file=sys.stderr)
        return 1
    print(f"tfamp_rewrite: op libraries (UnscaleAndCheckFinite, RoundToHalf) in {libs.directory} "
          f"({time.time() - start:.1f} s)")
    print(f"  cpu: {libs.cpu.name}")
    print(f"  gpu: {libs.gpu.name if libs.gpu else 'not built: ' + (libs.gpu_skipped or 'failed')}")
    import tensorflow as tf

    try:
        tf.load_op_library(str(libs.preferred))
    except tf.errors.OpError as e:
        print(f"tfamp_rewrite: {libs.preferred} does not load: {e}", file=sys.stderr)
        return 1
    if libs.gpu_error:
        print(f"tfamp_rewrite: the GPU library failed to build (the CPU one works):\n"
              f"{libs.gpu_error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TensorFlow 1.15's wheel, downloaded once from PyPI and unpacked as an install would lay it out.

TensorFlow 1.15 installs only on Python <= 3.7, but its wheel holds what the 1.15 checks
need without installing it: the C++ headers, ``libtensorflow_framework.so.1``,
``_pywrap_tensorflow_internal.so`` (TensorFlow's C API) and the Python API tree.

``tf115_tree() -> Tf115Tree`` downloads ``TF115_REQUIREMENT`` with pip (once; the wheel is
kept under ``$TFAMP_TF115_CACHE``, default ``~/.cache/tfamp_rewrite/tf1.15``) and unpacks
those parts into one ``tensorflow_core/`` directory, merging the header trees the wheel
splits between ``tensorflow_core/include`` and ``*.data/purelib/tensorflow_core/include``.
A failed download raises ``Tf115Unavailable`` with one line saying why and what to do:
the checks must fail, never pass without TensorFlow 1.15.

``python tests/support/tf115_wheel.py`` does the same and prints where the tree is.
"""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# The newest 1.15, which NVIDIA's 1.15.5+nv builds on (PyPI serves tensorflow-cpu only up to
# 1.15.0; tensorflow 1.15.5's manylinux2010 wheel is a CPU build as well).
TF115_REQUIREMENT = os.environ.get("TFAMP_TF115_REQUIREMENT", "tensorflow==1.15.5")
CACHE_ENV = "TFAMP_TF115_CACHE"
# The wheel's platform tags: TensorFlow 1.15 was built for CPython 3.7 (manylinux2010).
PIP_PLATFORM_ARGS = ("--no-deps", "--only-binary=:all:", "--python-version", "3.7",
                     "--platform", "manylinux2010_x86_64", "--implementation", "cp",
                     "--abi", "cp37m")
_COMPLETE = ".unpacked"  # written last: a tree without it is an interrupted unpack


class Tf115Unavailable(RuntimeError):
    """TensorFlow 1.15's wheel could not be downloaded or unpacked."""


class Tf115Tree(collections.namedtuple("Tf115Tree", "root wheel")):
    """An unpacked TensorFlow 1.15: ``root`` holds ``tensorflow_core/`` (and ``tensorflow/``)."""

    __slots__ = ()

    @property
    def core(self) -> Path:
        """``tensorflow_core/``: what ``tf.sysconfig.get_lib()`` returns on a 1.15 install."""
        return self.root / "tensorflow_core"

    @property
    def include(self) -> Path:
        """What ``tf.sysconfig.get_include()`` returns on a 1.15 install."""
        return self.core / "include"

    @property
    def framework_library(self) -> Path:
        return self.core / "libtensorflow_framework.so.1"

    @property
    def pywrap_library(self) -> Path:
        """The Python extension, which holds TensorFlow's C API (``TF_*``)."""
        return self.core / "python" / "_pywrap_tensorflow_internal.so"

    @property
    def version(self) -> str:
        return self.wheel.name.split("-")[1]


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "tfamp_rewrite" / "tf1.15"


def _wanted(member: str) -> str:
    """Where a wheel member goes in the tree, or "" when the checks do not need it."""
    for prefix in ("tensorflow_core/", "tensorflow/"):
        if member.startswith(prefix):
            break
    else:
        data = member.split("/", 3)  # <dist>.data/purelib/tensorflow_core/include/...
        if len(data) == 4 and data[0].endswith(".data") and data[1] == "purelib" \
                and data[2] == "tensorflow_core" and data[3].startswith("include/"):
            return "tensorflow_core/" + data[3]
        return ""
    if member.endswith("/"):
        return ""
    if member.startswith("tensorflow_core/include/") or member.endswith(".py"):
        return member
    if member in ("tensorflow_core/libtensorflow_framework.so.1",
                  "tensorflow_core/python/_pywrap_tensorflow_internal.so"):
        return member
    return ""  # the other extension modules (contrib, lite, ...): not needed


def _wheel_prefix(requirement: str) -> str:
    """``tensorflow-cpu==1.15.0`` -> ``tensorflow_cpu-1.15.0-``, how its wheel's name starts."""
    name, separator, version = requirement.partition("==")
    if not separator or not name or not version:
        raise Tf115Unavailable("TFAMP_TF115_REQUIREMENT=%r names no exact version; use e.g. "
                               "tensorflow==1.15.5" % requirement)
    return "%s-%s-" % (name.strip().replace("-", "_"), version.strip())


def _download(directory: Path) -> Path:
    wheels = sorted(directory.glob(_wheel_prefix(TF115_REQUIREMENT) + "*.whl"))
    if wheels:
        return wheels[0]
    directory.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="download-", dir=str(directory)))
    try:
        argv = [sys.executable, "-m", "pip", "download", *PIP_PLATFORM_ARGS, "--dest",
                str(scratch), TF115_REQUIREMENT]
        result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, check=False)
        wheels = sorted(scratch.glob("*.whl"))
        if result.returncode != 0 or not wheels:
            last = [line for line in result.stdout.splitlines() if line.strip()][-1:]
            raise Tf115Unavailable(
                "could not download %s from PyPI (%s); the TensorFlow 1.15 checks need network "
                "access once, after which the wheel is cached in %s"
                % (TF115_REQUIREMENT, last[0] if last else "pip exited %d" % result.returncode,
                   directory))
        target = directory / wheels[0].name
        os.replace(str(wheels[0]), str(target))
        return target
    finally:
        shutil.rmtree(str(scratch), ignore_errors=True)


def _unpack(wheel: Path, root: Path) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=root.name + ".unpacking-", dir=str(root.parent)))
    try:
        try:
            with zipfile.ZipFile(str(wheel)) as archive:
                for info in archive.infolist():
                    target = _wanted(info.filename)
                    if target:
                        path = scratch / target
                        path.parent.mkdir(parents=True, exist_ok=True)
                        with archive.open(info) as source, open(str(path), "wb") as sink:
                            shutil.copyfileobj(source, sink, 1 << 20)
        except (zipfile.BadZipFile, OSError) as error:
            wheel.unlink()
            raise Tf115Unavailable("%s is not a usable wheel (%s); it was removed, run again to "
                                   "download it anew" % (wheel, error)) from error
        (scratch / _COMPLETE).write_text(wheel.name)
        if root.exists():
            shutil.rmtree(str(root))
        os.rename(str(scratch), str(root))
    finally:
        shutil.rmtree(str(scratch), ignore_errors=True)


def tf115_tree() -> Tf115Tree:
    """The unpacked TensorFlow 1.15 tree, downloading and unpacking it on first use."""
    directory = cache_dir()
    wheel = _download(directory)
    root = directory / wheel.name[:-len(".whl")]
    if not (root / _COMPLETE).is_file():
        _unpack(wheel, root)
    return Tf115Tree(root, wheel)


def main() -> int:
    start = time.time()
    try:
        tree = tf115_tree()
    except Tf115Unavailable as error:
        print("test-tf115: %s" % error, file=sys.stderr)
        return 1
    print("test-tf115: TensorFlow %s unpacked in %s (%.1f s)" % (tree.version, tree.root,
                                                                time.time() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())

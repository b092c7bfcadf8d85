"""TensorFlow runtimes in child processes: 1.15 (through its C API) and this Python's 2.x.

The process running the tests has imported TensorFlow 2.x, so TensorFlow 1.15 cannot load
into it, and its 2.x uses oneDNN kernels 1.15 lacks. Graphs are made here and run by
``runtime_server.py`` children, each answering the same calls::

    with tf115_process(tree) as tf115, tf2_process() as tf2:
        tf115.version()                                      # '1.15.5'
        tf115.run(graph_def_bytes, {"x:0": array}, ["y:0"], config=config_bytes)
        tf2.run(graph_def_bytes, {"x:0": array}, ["y:0"], config=config_bytes)

A call the runtime refuses raises ``RuntimeFailure`` with TensorFlow's own message; a
child that dies raises it with the end of the child's stderr.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile

from tf115_capi import build_shim

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime_server.py")
_AMP_VARIABLES = ("TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE",
                  "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING")


class RuntimeFailure(RuntimeError):
    """TensorFlow refused a call (its message), or the runtime process died."""


def tf115_process(tree) -> "RuntimeProcess":
    """TensorFlow 1.15 from an unpacked wheel (``tf115_wheel.tf115_tree()``)."""
    return RuntimeProcess(["tf115", str(tree.core), str(build_shim(tree.root))], "TensorFlow 1.15")


def tf2_process() -> "RuntimeProcess":
    """This Python's TensorFlow 2.x, with Eigen kernels as in 1.15 (see tf2_runtime.py)."""
    return RuntimeProcess(["tf2"], "TensorFlow 2.x", TF_ENABLE_ONEDNN_OPTS="0")


class RuntimeProcess:
    """One child process holding one TensorFlow; a context manager (or call ``close``)."""

    def __init__(self, argv, name: str, **environ):
        self.name = name
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                   **environ)
        for variable in _AMP_VARIABLES:  # the start-up hook stays out of the child
            env.pop(variable, None)
        self._process = subprocess.Popen([sys.executable, SERVER] + list(argv),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, env=env)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=60)
        self._stderr.close()

    def _call(self, method, *args):
        try:
            pickle.dump((method, args, {}), self._process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._process.stdin.flush()
            status, value = pickle.load(self._process.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError) as error:
            self._process.wait(timeout=60)
            self._stderr.seek(0)
            tail = self._stderr.read().decode("utf-8", "replace").strip().splitlines()[-15:]
            raise RuntimeFailure("the %s process died (exit %s, %s) during %s:\n%s" % (
                self.name, self._process.returncode, type(error).__name__, method,
                "\n".join(tail))) from error
        if status != "ok":
            raise RuntimeFailure(value)
        return value

    def version(self) -> str:
        """``TF_Version()`` (1.15) or ``tf.__version__`` (2.x)."""
        return self._call("version")

    def build_facts(self):
        """1.15: ``{"cxx11_abi_flag": int, "monolithic_build": int}`` from its framework library."""
        return self._call("build_facts")

    def all_op_list(self) -> bytes:
        """1.15: the serialized OpList of every registered op (loaded libraries' included)."""
        return self._call("all_op_list")

    def export_graph_def(self, graph_def: bytes) -> bytes:
        """1.15: ``graph_def`` imported and exported again, serialized as 1.15 writes it."""
        return self._call("export_graph_def", graph_def)

    def load_library(self, path) -> bytes:
        """1.15: ``TF_LoadLibrary(path)``; returns the library's serialized OpList."""
        return self._call("load_library", str(path))

    def library_string(self, path, symbol: str) -> str:
        """1.15: what ``const char* symbol(void)`` of the loaded library ``path`` returns."""
        return self._call("library_string", str(path), symbol)

    def set_environment(self, name: str, value) -> None:
        """1.15: sets (None: unsets) an environment variable of the runtime's process."""
        self._call("set_environment", name, value)

    def registered_kernels(self, op_type: str) -> bytes:
        """1.15: the serialized KernelList registered for ``op_type``."""
        return self._call("registered_kernels", op_type)

    def run(self, graph_def: bytes, feeds, fetches, targets=(), config: bytes = b""):
        """Imports ``graph_def`` into a fresh graph and session and runs it once."""
        return self._call("run", graph_def, dict(feeds), list(fetches), list(targets), config)

    def run_steps(self, graph_def: bytes, steps, config: bytes = b""):
        """Several ``(feeds, fetches, targets)`` runs in one session, in order."""
        return self._call("run_steps", graph_def,
                          [(dict(f), list(o), list(t)) for f, o, t in steps], config)

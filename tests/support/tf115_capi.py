"""TensorFlow 1.15's C API from this Python, through ctypes: import graphs, run them, load ops.

Never import this module into a process that has imported TensorFlow 2.x (two TensorFlow
runtimes in one process clash); ``runtime_process`` runs it in a child process. It needs
numpy only.

How the 1.15 libraries load here (Python 3.11, while 1.15 was built for 3.7): load
``libtensorflow_framework.so.1``, then ``_pywrap_tensorflow_internal.so``, both with
RTLD_GLOBAL. The extension module's Python init is never called: only its ``TF_*`` C
functions. Its one load-time reference that this Python no longer defines,
``_Py_CheckRecursionLimit`` (removed in CPython 3.9), is provided by a one-line shim
library loaded first. Protocol buffers cross as serialized bytes.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

# TF_DataType values (tensorflow/core/framework/types.proto).
_NUMPY_OF_TF = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 9: np.int64,
                10: np.bool_, 19: np.float16}
_TF_OF_NUMPY = {np.dtype(v): k for k, v in _NUMPY_OF_TF.items()}
TF_STRING = 7

_SHIM_SOURCE = "int _Py_CheckRecursionLimit = 1000;  /* removed from CPython 3.9 */\n"
_SHIM_NAME = "libpy_recursion_limit_shim.so"


class Tf115Error(RuntimeError):
    """A TF_Status that was not OK: TensorFlow 1.15's own message."""


class _Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_size_t),
                ("data_deallocator", ctypes.c_void_p)]


class _Output(ctypes.Structure):
    _fields_ = [("oper", ctypes.c_void_p), ("index", ctypes.c_int)]


def _signatures(lib):
    """Argument and result types of the TF_* functions used here (TF 1.15's c_api.h)."""
    p, i, s, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t
    table = {
        "TF_Version": ([], s),
        "TF_NewStatus": ([], p), "TF_DeleteStatus": ([p], None),
        "TF_GetCode": ([p], i), "TF_Message": ([p], s),
        "TF_NewBufferFromString": ([p, sz], ctypes.POINTER(_Buffer)),
        "TF_NewBuffer": ([], ctypes.POINTER(_Buffer)),
        "TF_DeleteBuffer": ([ctypes.POINTER(_Buffer)], None),
        "TF_GetAllOpList": ([], ctypes.POINTER(_Buffer)),
        "TF_LoadLibrary": ([s, p], p), "TF_GetOpList": ([p], _Buffer),
        "TF_GetRegisteredKernelsForOp": ([s, p], ctypes.POINTER(_Buffer)),
        "TF_NewGraph": ([], p), "TF_DeleteGraph": ([p], None),
        "TF_NewImportGraphDefOptions": ([], p), "TF_DeleteImportGraphDefOptions": ([p], None),
        "TF_GraphImportGraphDef": ([p, ctypes.POINTER(_Buffer), p, p], None),
        "TF_GraphToGraphDef": ([p, ctypes.POINTER(_Buffer), p], None),
        "TF_GraphOperationByName": ([p, s], p),
        "TF_NewSessionOptions": ([], p), "TF_DeleteSessionOptions": ([p], None),
        "TF_SetConfig": ([p, p, sz, p], None),
        "TF_NewSession": ([p, p, p], p), "TF_CloseSession": ([p, p], None),
        "TF_DeleteSession": ([p, p], None),
        "TF_SessionRun": ([p, p, ctypes.POINTER(_Output), ctypes.POINTER(p), i,
                           ctypes.POINTER(_Output), ctypes.POINTER(p), i, ctypes.POINTER(p), i,
                           p, p], None),
        "TF_AllocateTensor": ([i, ctypes.POINTER(ctypes.c_int64), i, sz], p),
        "TF_DeleteTensor": ([p], None), "TF_TensorData": ([p], p),
        "TF_TensorByteSize": ([p], sz), "TF_TensorType": ([p], i),
        "TF_NumDims": ([p], i), "TF_Dim": ([p, i], ctypes.c_int64),
        "TF_StringEncodedSize": ([sz], sz),
        "TF_StringEncode": ([p, sz, p, sz, p], sz),
    }
    for name, (argtypes, restype) in table.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype


def build_shim(directory: Path) -> Path:
    """The shim library defining ``_Py_CheckRecursionLimit``, compiled once into ``directory``."""
    library = directory / _SHIM_NAME
    if not library.is_file():
        source = directory / "py_recursion_limit_shim.c"
        source.write_text(_SHIM_SOURCE)
        scratch = library.with_suffix(".so.%d" % os.getpid())
        subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", str(source), "-o",
                        str(scratch)], check=True)
        os.replace(str(scratch), str(library))
    return library


class Tf115Runtime:
    """TensorFlow 1.15 loaded from ``core`` (an unpacked ``tensorflow_core/``)."""

    errors = (Tf115Error,)  # what a refused call raises

    def __init__(self, core: Path, shim: Path):
        global_mode = ctypes.RTLD_GLOBAL
        ctypes.CDLL(str(shim), mode=global_mode)
        self.framework = ctypes.CDLL(str(core / "libtensorflow_framework.so.1"), mode=global_mode)
        self.lib = ctypes.CDLL(str(core / "python" / "_pywrap_tensorflow_internal.so"),
                               mode=global_mode)
        _signatures(self.lib)

    # -- facts about this TensorFlow -------------------------------------------------
    def version(self) -> str:
        return self.lib.TF_Version().decode()

    def build_facts(self) -> Dict[str, int]:
        """What 1.15's ``tf.sysconfig`` reads from its C++ side: the C++11 ABI flag, monolithic."""
        facts = {}
        for key, symbol in (("cxx11_abi_flag", "_Z17tf_cxx11_abi_flagv"),
                            ("monolithic_build", "_Z19tf_monolithic_buildv")):
            function = getattr(self.framework, symbol)
            function.restype, function.argtypes = ctypes.c_int, []
            facts[key] = int(function())
        return facts

    def all_op_list(self) -> bytes:
        """The serialized OpList of every op this TensorFlow registers."""
        buffer = self.lib.TF_GetAllOpList()
        try:
            return ctypes.string_at(buffer.contents.data, buffer.contents.length)
        finally:
            self.lib.TF_DeleteBuffer(buffer)

    def export_graph_def(self, graph_def: bytes) -> bytes:
        """``graph_def`` imported into 1.15 and exported again: a GraphDef as 1.15 writes it."""
        lib = self.lib
        graph = lib.TF_NewGraph()
        buffer = lib.TF_NewBuffer()
        try:
            self._import(graph, graph_def)
            with _Status(lib) as status:
                lib.TF_GraphToGraphDef(graph, buffer, status.handle)
                status.check("exporting the GraphDef")
            return ctypes.string_at(buffer.contents.data, buffer.contents.length)
        finally:
            lib.TF_DeleteBuffer(buffer)
            lib.TF_DeleteGraph(graph)

    # -- custom ops ----------------------------------------------------------------
    def load_library(self, path: str) -> bytes:
        """``TF_LoadLibrary``: registers the library's ops and kernels; returns its OpList."""
        with _Status(self.lib) as status:
            handle = self.lib.TF_LoadLibrary(str(path).encode(), status.handle)
            status.check("TF_LoadLibrary(%s)" % path)
        ops = self.lib.TF_GetOpList(handle)
        return ctypes.string_at(ops.data, ops.length)

    def library_string(self, path: str, symbol: str) -> str:
        """What ``const char* symbol(void)`` of the (loaded) library ``path`` returns."""
        function = getattr(ctypes.CDLL(str(path)), symbol)
        function.restype, function.argtypes = ctypes.c_char_p, []
        return function().decode()

    @staticmethod
    def set_environment(name: str, value) -> None:
        """Sets (or, for None, unsets) an environment variable of this process."""
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    def registered_kernels(self, op_type: str) -> bytes:
        """The serialized KernelList of ``op_type`` (loaded libraries' kernels included)."""
        with _Status(self.lib) as status:
            buffer = self.lib.TF_GetRegisteredKernelsForOp(op_type.encode(), status.handle)
            status.check("listing the kernels of %s" % op_type)
        try:
            return ctypes.string_at(buffer.contents.data, buffer.contents.length)
        finally:
            self.lib.TF_DeleteBuffer(buffer)

    # -- graphs --------------------------------------------------------------------
    def run(self, graph_def: bytes, feeds: Dict[str, object], fetches: Sequence[str],
            targets: Sequence[str] = (), config: bytes = b"") -> List[np.ndarray]:
        """Imports ``graph_def`` into a new graph and session, runs ``targets`` and ``fetches``.

        ``feeds`` maps tensor names to numpy arrays (or bytes, for a scalar string).
        """
        lib = self.lib
        graph = lib.TF_NewGraph()
        try:
            self._import(graph, graph_def)
            return self._run_in(graph, feeds, fetches, targets, config)
        finally:
            lib.TF_DeleteGraph(graph)

    def run_steps(self, graph_def: bytes, steps, config: bytes = b"") -> List[List[np.ndarray]]:
        """Like ``run`` for several ``(feeds, fetches, targets)`` in one session (restore, then run)."""
        lib = self.lib
        graph = lib.TF_NewGraph()
        try:
            self._import(graph, graph_def)
            session = self._new_session(graph, config)
            try:
                return [self._session_run(graph, session, *step) for step in steps]
            finally:
                self._close(session)
        finally:
            lib.TF_DeleteGraph(graph)

    def _import(self, graph, graph_def: bytes) -> None:
        lib = self.lib
        buffer = lib.TF_NewBufferFromString(graph_def, len(graph_def))
        options = lib.TF_NewImportGraphDefOptions()
        try:
            with _Status(lib) as status:
                lib.TF_GraphImportGraphDef(graph, buffer, options, status.handle)
                status.check("importing the GraphDef")
        finally:
            lib.TF_DeleteImportGraphDefOptions(options)
            lib.TF_DeleteBuffer(buffer)

    def _new_session(self, graph, config: bytes):
        lib = self.lib
        options = lib.TF_NewSessionOptions()
        try:
            with _Status(lib) as status:
                if config:
                    lib.TF_SetConfig(options, config, len(config), status.handle)
                    status.check("setting the session config")
                session = lib.TF_NewSession(graph, options, status.handle)
                status.check("creating a session")
            return session
        finally:
            lib.TF_DeleteSessionOptions(options)

    def _close(self, session) -> None:
        with _Status(self.lib) as status:
            self.lib.TF_CloseSession(session, status.handle)
            self.lib.TF_DeleteSession(session, status.handle)

    def _run_in(self, graph, feeds, fetches, targets, config):
        session = self._new_session(graph, config)
        try:
            return self._session_run(graph, session, feeds, fetches, targets)
        finally:
            self._close(session)

    def _session_run(self, graph, session, feeds, fetches, targets) -> List[np.ndarray]:
        lib = self.lib
        inputs = (_Output * max(1, len(feeds)))()
        values = (ctypes.c_void_p * max(1, len(feeds)))()
        for k, (name, value) in enumerate(feeds.items()):
            inputs[k] = self._output(graph, name)
            values[k] = self._tensor(value)
        outputs = (_Output * max(1, len(fetches)))()
        for k, name in enumerate(fetches):
            outputs[k] = self._output(graph, name)
        results = (ctypes.c_void_p * max(1, len(fetches)))()
        operations = (ctypes.c_void_p * max(1, len(targets)))()
        for k, name in enumerate(targets):
            operations[k] = self._operation(graph, name)
        try:
            with _Status(lib) as status:
                lib.TF_SessionRun(session, None, inputs, values, len(feeds), outputs, results,
                                  len(fetches), operations, len(targets), None, status.handle)
                status.check("running %s" % ", ".join(list(fetches) + list(targets)))
            return [self._to_numpy(results[k]) for k in range(len(fetches))]
        finally:
            for k in range(len(feeds)):
                lib.TF_DeleteTensor(values[k])
            for k in range(len(fetches)):
                if results[k]:
                    lib.TF_DeleteTensor(results[k])

    def _operation(self, graph, name: str):
        operation = self.lib.TF_GraphOperationByName(graph, name.encode())
        if not operation:
            raise Tf115Error("no operation %r in the imported graph" % name)
        return operation

    def _output(self, graph, tensor_name: str) -> _Output:
        name, _, index = tensor_name.partition(":")
        return _Output(self._operation(graph, name), int(index or 0))

    def _tensor(self, value):
        if isinstance(value, bytes):
            return self._string_scalar(value)
        array = np.asarray(value, order="C")  # (ascontiguousarray would make scalars 1-d)
        dtype = _TF_OF_NUMPY.get(array.dtype)
        if dtype is None:
            raise Tf115Error("cannot feed numpy dtype %s" % array.dtype)
        dims = (ctypes.c_int64 * max(1, array.ndim))(*array.shape)
        tensor = self.lib.TF_AllocateTensor(dtype, dims, array.ndim, array.nbytes)
        ctypes.memmove(self.lib.TF_TensorData(tensor), array.ctypes.data, array.nbytes)
        return tensor

    def _string_scalar(self, value: bytes):
        """TF 1.15's string tensor layout: one uint64 offset per element, then encoded bytes."""
        lib = self.lib
        encoded = lib.TF_StringEncodedSize(len(value))
        tensor = lib.TF_AllocateTensor(TF_STRING, None, 0, 8 + encoded)
        data = lib.TF_TensorData(tensor)
        ctypes.memset(data, 0, 8)
        with _Status(lib) as status:
            lib.TF_StringEncode(value, len(value), data + 8, encoded, status.handle)
            status.check("encoding a string")
        return tensor

    def _to_numpy(self, tensor) -> np.ndarray:
        lib = self.lib
        dtype = _NUMPY_OF_TF.get(lib.TF_TensorType(tensor))
        if dtype is None:
            raise Tf115Error("cannot fetch TF_DataType %d" % lib.TF_TensorType(tensor))
        shape = [lib.TF_Dim(tensor, k) for k in range(lib.TF_NumDims(tensor))]
        size = lib.TF_TensorByteSize(tensor)
        raw = ctypes.string_at(lib.TF_TensorData(tensor), size)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


class _Status:
    """A TF_Status for one call; ``check`` raises Tf115Error with TensorFlow's message."""

    def __init__(self, lib):
        self.lib = lib
        self.handle = None

    def __enter__(self):
        self.handle = self.lib.TF_NewStatus()
        return self

    def __exit__(self, *exc):
        self.lib.TF_DeleteStatus(self.handle)

    def check(self, doing: str) -> None:
        code = self.lib.TF_GetCode(self.handle)
        if code != 0:
            raise Tf115Error("TensorFlow 1.15, %s: %s" % (doing, self.lib.TF_Message(self.handle).decode(
                "utf-8", "replace")))

"""ctypes bindings of the kernel harness (harness_capi.cu), in either build.

``KernelHarness(path)`` wraps the nvcc build (a real GPU) and the g++ build against the grid
emulation alike: "device" pointers are plain integers; with the emulation they are host
addresses, so numpy buffers can be handed to the kernel directly. The emulation-only calls
(thread order, counting without executing) exist only there (``harness.emulated``).
"""
from __future__ import annotations

import collections
import ctypes
from typing import Sequence, Tuple

import numpy as np

I64P = ctypes.POINTER(ctypes.c_int64)
I32P = ctypes.POINTER(ctypes.c_int32)
U64P = ctypes.POINTER(ctypes.c_uint64)
IntP = ctypes.POINTER(ctypes.c_int)
FloatP = ctypes.POINTER(ctypes.c_float)
HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 1, 2, 3
THREAD_ORDERS = {"in_order": 0, "reversed": 1, "shuffled": 2}
EMULATED_DRIVER_VERSION = 13000  # what the emulation's cudaDriverGetVersion answers until set

DeviceInfo = collections.namedtuple("DeviceInfo", "name major minor multiprocessors memory_bytes")
LaunchCounts = collections.namedtuple("LaunchCounts", "launches blocks threads")
PlanShape = collections.namedtuple("PlanShape", "launches blocks table_bytes")
TableSlots = collections.namedtuple("TableSlots", "small large")
MOST_TENSORS_ALLOWED = 0  # gpu_launch.h: kMostTensorsAllowed, what the op passes


class HarnessError(RuntimeError):
    """A CUDA call or the op's launch sequence failed; the message is the harness's."""


def _signatures(lib):
    c = ctypes
    table = {
        "tfamp_harness_error": (c.c_char_p, []),
        "tfamp_harness_max_tensors_per_launch": (c.c_int, []),
        "tfamp_harness_table_slots": (None, [IntP, IntP]),
        "tfamp_harness_default_chunk_elements": (c.c_int64, []),
        "tfamp_harness_device": (c.c_int, [c.c_char_p, c.c_int, IntP, IntP, IntP, I64P]),
        "tfamp_harness_reset": (c.c_int, []),
        "tfamp_harness_malloc": (c.c_void_p, [c.c_int64]),
        "tfamp_harness_free": (c.c_int, [c.c_void_p]),
        "tfamp_harness_copy": (c.c_int, [c.c_void_p, c.c_void_p, c.c_int64, c.c_int]),
        "tfamp_harness_memset": (c.c_int, [c.c_void_p, c.c_int, c.c_int64]),
        "tfamp_harness_plan": (c.c_int, [I64P, I32P, c.c_int, c.c_int64, c.c_int, IntP, I64P,
                                         IntP]),
        "tfamp_harness_unscale": (c.c_int, [U64P, U64P, I64P, I32P, c.c_int, c.c_int64, c.c_int,
                                            c.c_void_p, c.c_void_p, IntP]),
        "tfamp_harness_time_unscale": (c.c_int, [U64P, U64P, I64P, I32P, c.c_int, c.c_int64,
                                                 c.c_int, c.c_void_p, c.c_void_p, c.c_int,
                                                 FloatP, FloatP]),
        "tfamp_harness_time_copy": (c.c_int, [c.c_void_p, c.c_void_p, c.c_int64, c.c_int,
                                              FloatP]),
        "tfamp_harness_convert": (c.c_int, [c.c_int, c.c_void_p, c.c_void_p, c.c_int64,
                                            c.c_float]),
    }
    for name, (restype, argtypes) in table.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes


def _c_array(values, dtype):
    array = np.ascontiguousarray(values, dtype=dtype)
    return array, array.ctypes.data_as(ctypes.POINTER(np.ctypeslib.as_ctypes_type(dtype)))


class TensorList:
    """The C arrays describing a tensor list: input and output addresses, sizes, type codes."""

    def __init__(self, inputs: Sequence[int], outputs: Sequence[int], sizes: Sequence[int],
                 type_codes: Sequence[int]):
        if not len(inputs) == len(outputs) == len(sizes) == len(type_codes):
            raise ValueError("inputs, outputs, sizes and type codes differ in length")
        self.count = len(sizes)
        self._in, self.in_p = _c_array(inputs, np.uint64)
        self._out, self.out_p = _c_array(outputs, np.uint64)
        self._sizes, self.sizes_p = _c_array(sizes, np.int64)
        self._types, self.types_p = _c_array(type_codes, np.int32)


class KernelHarness:
    """One loaded harness library (GPU or emulated)."""

    def __init__(self, path: str):
        self.path = str(path)
        try:
            self.lib = ctypes.CDLL(self.path)
            _signatures(self.lib)
        except (OSError, AttributeError) as error:
            raise HarnessError(f"{self.path} is not a loadable kernel harness library "
                               f"({error}); rebuild it") from error
        self.emulated = hasattr(self.lib, "tfamp_emulation_set_thread_order")
        if self.emulated:
            self.lib.tfamp_emulation_set_thread_order.argtypes = [ctypes.c_int, ctypes.c_uint64]
            self.lib.tfamp_emulation_set_execute.argtypes = [ctypes.c_int]
            self.lib.tfamp_emulation_take_counters.argtypes = [I64P, I64P, I64P]
            self.lib.tfamp_emulation_set_driver_version.argtypes = [ctypes.c_int]
            self.lib.tfamp_emulation_set_capturing.argtypes = [ctypes.c_int]
            self.lib.tfamp_emulation_set_refuse_large_launches.argtypes = [ctypes.c_int]
        self.chunk_elements = self.lib.tfamp_harness_default_chunk_elements()

    @property
    def max_tensors(self) -> int:
        """The most tensors one launch on the default stream takes here: the 32 KB table's slots
        where the toolkit and the driver pass such kernel parameters (CUDA 12.1 and newer), the
        stream is not being captured into a graph and no such launch was refused, else the
        4 KB table's."""
        return self.lib.tfamp_harness_max_tensors_per_launch()

    @property
    def table_slots(self) -> TableSlots:
        """The slots of the 4 KB and the 32 KB launch table (launch_plan.h)."""
        small, large = ctypes.c_int(), ctypes.c_int()
        self.lib.tfamp_harness_table_slots(small, large)
        return TableSlots(small.value, large.value)

    def _check(self, status, what: str):
        if status != 0:
            raise HarnessError(f"{what}: {self.lib.tfamp_harness_error().decode()}")

    # --- device memory ---------------------------------------------------------------------

    def device(self) -> DeviceInfo:
        name = ctypes.create_string_buffer(256)
        major, minor, sms = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        memory = ctypes.c_int64()
        self._check(self.lib.tfamp_harness_device(name, 256, major, minor, sms, memory), "device")
        return DeviceInfo(name.value.decode(), major.value, minor.value, sms.value, memory.value)

    def reset(self) -> None:
        """Ends the device context: every allocation must have been freed by now."""
        self._check(self.lib.tfamp_harness_reset(), "reset")

    def malloc(self, nbytes: int) -> int:
        pointer = self.lib.tfamp_harness_malloc(max(int(nbytes), 1))
        if not pointer:
            self._check(-1, f"allocating {nbytes} bytes")
        return int(pointer)

    def free(self, pointer: int) -> None:
        self._check(self.lib.tfamp_harness_free(pointer), "free")

    def upload(self, pointer: int, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        self._check(self.lib.tfamp_harness_copy(pointer, host.ctypes.data, host.nbytes,
                                                HOST_TO_DEVICE), "upload")

    def download(self, pointer: int, nbytes: int) -> np.ndarray:
        host = np.empty(int(nbytes), np.uint8)
        self._check(self.lib.tfamp_harness_copy(host.ctypes.data, pointer, host.nbytes,
                                                DEVICE_TO_HOST), "download")
        return host

    def memset(self, pointer: int, value: int, nbytes: int) -> None:
        self._check(self.lib.tfamp_harness_memset(pointer, value, nbytes), "memset")

    # --- the op ----------------------------------------------------------------------------

    def plan(self, sizes: Sequence[int], type_codes: Sequence[int], chunk_elements=None,
             max_tensors=None) -> PlanShape:
        """The launches, blocks and table bytes the op plans for such a list; nothing runs."""
        sizes_a, sizes_p = _c_array(sizes, np.int64)
        _types_a, types_p = _c_array(type_codes, np.int32)
        launches, blocks, table_bytes = ctypes.c_int(), ctypes.c_int64(), ctypes.c_int()
        self._check(self.lib.tfamp_harness_plan(
            sizes_p, types_p, len(sizes_a), chunk_elements or self.chunk_elements,
            max_tensors or MOST_TENSORS_ALLOWED, launches, blocks, table_bytes), "plan")
        return PlanShape(launches.value, blocks.value, table_bytes.value)

    def unscale(self, tensors: TensorList, inv_scale_ptr: int, all_finite_ptr: int,
                chunk_elements=None, max_tensors=None) -> int:
        """Runs the op's launch sequence once and waits; returns the number of launches."""
        launches = ctypes.c_int()
        self._check(self.lib.tfamp_harness_unscale(
            tensors.in_p, tensors.out_p, tensors.sizes_p, tensors.types_p, tensors.count,
            chunk_elements or self.chunk_elements, max_tensors or MOST_TENSORS_ALLOWED,
            inv_scale_ptr, all_finite_ptr, launches), "unscale")
        return launches.value

    def time_unscale(self, tensors: TensorList, inv_scale_ptr: int, all_finite_ptr: int,
                     iterations: int, chunk_elements=None, max_tensors=None) -> Tuple[float, float]:
        """(device ms, host ms) per call, over ``iterations`` back-to-back calls."""
        device_ms, host_ms = ctypes.c_float(), ctypes.c_float()
        self._check(self.lib.tfamp_harness_time_unscale(
            tensors.in_p, tensors.out_p, tensors.sizes_p, tensors.types_p, tensors.count,
            chunk_elements or self.chunk_elements, max_tensors or MOST_TENSORS_ALLOWED,
            inv_scale_ptr, all_finite_ptr, iterations, device_ms, host_ms), "timing the op")
        return device_ms.value, host_ms.value

    def time_copy(self, dst: int, src: int, nbytes: int, iterations: int) -> float:
        """Device ms per device-to-device cudaMemcpy of ``nbytes``."""
        device_ms = ctypes.c_float()
        self._check(self.lib.tfamp_harness_time_copy(dst, src, nbytes, iterations, device_ms),
                    "timing cudaMemcpy")
        return device_ms.value

    def convert(self, conversion: int, inputs: np.ndarray, out_dtype, scale: float = 1.0):
        """Runs the probe kernel's ``conversion`` (harness_capi.cu: enum Conversion) on the
        device over ``inputs`` (uint16 or uint32 bits); returns its output bits."""
        inputs = np.ascontiguousarray(inputs)
        out_dtype = np.dtype(out_dtype)
        source = self.malloc(inputs.nbytes)
        target = self.malloc(inputs.size * out_dtype.itemsize)
        try:
            self.upload(source, inputs)
            self._check(self.lib.tfamp_harness_convert(conversion, source, target, inputs.size,
                                                       scale), "conversion probe")
            return self.download(target, inputs.size * out_dtype.itemsize).view(out_dtype)
        finally:
            self.free(source)
            self.free(target)

    # --- the grid emulation only -----------------------------------------------------------

    def set_thread_order(self, order: str, seed: int = 0) -> None:
        self._emulation_only()
        self.lib.tfamp_emulation_set_thread_order(THREAD_ORDERS[order], seed)

    def set_execute(self, execute: bool) -> None:
        self._emulation_only()
        self.lib.tfamp_emulation_set_execute(int(execute))

    def set_driver_version(self, version: int) -> None:
        """What the emulated driver reports from now on (12000: CUDA 12.0)."""
        self._emulation_only()
        self.lib.tfamp_emulation_set_driver_version(int(version))

    def set_capturing(self, capturing: bool) -> None:
        """Whether the emulated streams report being captured into a CUDA graph."""
        self._emulation_only()
        self.lib.tfamp_emulation_set_capturing(int(capturing))

    def set_refuse_large_launches(self, refuse: bool) -> None:
        """Whether the emulated driver refuses launches with over 4 KB of parameters whatever
        version it reports."""
        self._emulation_only()
        self.lib.tfamp_emulation_set_refuse_large_launches(int(refuse))

    def take_counts(self) -> LaunchCounts:
        """Launches, blocks and threads the emulation ran since the last call."""
        self._emulation_only()
        counts = [ctypes.c_int64() for _ in range(3)]
        self.lib.tfamp_emulation_take_counters(*counts)
        return LaunchCounts(*(c.value for c in counts))

    def _emulation_only(self):
        if not self.emulated:
            raise HarnessError(f"{self.path} is the GPU build: it has no emulation controls")

"""Is there a CUDA GPU? Asked of the driver (libcuda) directly: nothing to build or install.

``visible_gpu()`` returns ``(GpuInfo, None)`` for device 0, or ``(None, why not)`` where
``why not`` is one line: no driver library, the driver's error name, or zero devices.
"""
from __future__ import annotations

import collections
import ctypes
from typing import Optional, Tuple

GpuInfo = collections.namedtuple("GpuInfo", "name major minor count")

_CC_MAJOR, _CC_MINOR = 75, 76  # CUdevice_attribute: compute capability
_DRIVER_NAMES = ("libcuda.so.1", "libcuda.so")


def _load_driver():
    errors = []
    for name in _DRIVER_NAMES:
        try:
            return ctypes.CDLL(name), None
        except OSError as error:
            errors.append(str(error))
    return None, f"no NVIDIA driver: {errors[0]}"


def _error_name(driver, status: int) -> str:
    name = ctypes.c_char_p()
    if driver.cuGetErrorName(status, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return f"CUresult {status}"


def visible_gpu() -> Tuple[Optional[GpuInfo], Optional[str]]:
    driver, why = _load_driver()
    if driver is None:
        return None, why
    status = driver.cuInit(0)
    if status != 0:
        return None, f"cuInit failed: {_error_name(driver, status)}"
    count = ctypes.c_int()
    status = driver.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return None, f"cuDeviceGetCount failed: {_error_name(driver, status)}"
    if count.value < 1:
        return None, "the driver sees no device (check CUDA_VISIBLE_DEVICES)"
    device = ctypes.c_int()
    name = ctypes.create_string_buffer(256)
    major, minor = ctypes.c_int(), ctypes.c_int()
    queries = (lambda: driver.cuDeviceGet(ctypes.byref(device), 0),
               lambda: driver.cuDeviceGetName(name, 256, device),
               lambda: driver.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, device),
               lambda: driver.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, device))
    for query in queries:
        status = query()
        if status != 0:
            return None, f"querying device 0 failed: {_error_name(driver, status)}"
    return GpuInfo(name.value.decode(), major.value, minor.value, count.value), None

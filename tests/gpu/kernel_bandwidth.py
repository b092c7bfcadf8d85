"""Time per call of the op's kernel on a model's gradients, against a cudaMemcpy of the same
bytes and against the peers (peer_timing.py: PyTorch's fused op, a composite of per-tensor ops).

The kernel reads and writes every byte once (in place or not), as a device-to-device copy
does, so their bandwidths compare directly:

    moved bytes    = 2 * gradient bytes                      (read + write)
    bandwidth      = moved bytes / time
    vs memcpy      = memcpy time / kernel time               (target >= 0.85)
    vs PyTorch     = PyTorch time / kernel time              (target >= 1.2)
    vs composite   = composite time / kernel time            (reported)

Gradients sit in one device arena, 256-byte aligned each (as TensorFlow's allocator places
them); the copy moves the same number of bytes, contiguous, from the input arena to the
output arena. Times are device times from CUDA events over back-to-back calls; each call
plans on the host and enqueues, as the TensorFlow kernel does.
"""
from __future__ import annotations

import collections
import functools
from typing import List, Optional, Sequence

import numpy as np
from harness_library import KernelHarness, TensorList
from unscale_reference import BITS_DTYPE, ITEMSIZE, TYPE_CODES, from_float32

TARGET_RATIO = 0.85
PYTORCH_TARGET = 1.2
ALIGNMENT = 256


class BandwidthRow(collections.namedtuple(
        "BandwidthRow", "label tensors elements nbytes launches blocks table_bytes kernel_ms "
                        "host_ms copy_ms pytorch_ms composite_ms")):
    """One measurement: what ran (launches of ``table_bytes`` kernel parameters), and its
    kernel, host and memcpy times per call (ms); the peers' times, or None where they were
    not measured."""

    __slots__ = ()

    @property
    def kernel_gbps(self) -> float:
        return moved_gbps(self.nbytes, self.kernel_ms)

    @property
    def copy_gbps(self) -> float:
        return moved_gbps(self.nbytes, self.copy_ms)

    @property
    def ratio(self) -> float:
        """Kernel bandwidth over memcpy bandwidth (memcpy time / kernel time)."""
        return _speedup(self.copy_ms, self.kernel_ms)

    @property
    def vs_pytorch(self) -> Optional[float]:
        return None if self.pytorch_ms is None else _speedup(self.pytorch_ms, self.kernel_ms)

    @property
    def vs_composite(self) -> Optional[float]:
        return None if self.composite_ms is None else _speedup(self.composite_ms, self.kernel_ms)


def _speedup(other_ms: float, kernel_ms: float) -> float:
    return other_ms / kernel_ms if kernel_ms > 0 else float("nan")


def moved_gbps(nbytes: int, ms: float) -> float:
    """GB/s (1e9 bytes) of reading and writing ``nbytes`` in ``ms`` milliseconds."""
    return 2 * nbytes / (ms * 1e6) if ms > 0 else float("nan")


def arena_offsets(nbytes: Sequence[int]) -> List[int]:
    """Byte offset of each buffer in an arena, each ALIGNMENT-aligned; last: the arena size."""
    offsets = [0]
    for n in nbytes:
        offsets.append(offsets[-1] + (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)
    return offsets


@functools.lru_cache(maxsize=1)
def _host_arena(sizes: tuple, kind: str, seed: int) -> np.ndarray:
    """The gradients' bits in one arena (cached: in-place and out-of-place rows share it)."""
    item = ITEMSIZE[kind]
    offsets = arena_offsets([s * item for s in sizes])
    arena = np.zeros(offsets[-1] // item, BITS_DTYPE[kind])
    values = np.random.default_rng(seed).standard_normal(sum(sizes), dtype=np.float32)
    filled = 0
    for size, offset in zip(sizes, offsets):
        start = offset // item
        arena[start:start + size] = from_float32(kind, values[filled:filled + size])
        filled += size
    return arena


def measure(harness: KernelHarness, label: str, sizes: Sequence[int], kind: str,
            iterations: int, chunk_elements: Optional[int] = None, in_place: bool = False,
            seed: int = 0, max_tensors: Optional[int] = None) -> BandwidthRow:
    """Times the op on gradients of ``sizes`` elements of ``kind``, and a memcpy of as many bytes."""
    item = ITEMSIZE[kind]
    nbytes = [s * item for s in sizes]
    offsets = arena_offsets(nbytes)
    arena = _host_arena(tuple(sizes), kind, seed)
    inputs = harness.malloc(arena.nbytes)
    outputs = inputs if in_place else harness.malloc(arena.nbytes)
    scalars = harness.malloc(8)
    try:
        harness.upload(inputs, arena)
        inv_scale = 1.0 if in_place else 2.0**-7  # in place: values stay as they are
        harness.upload(scalars, np.array([inv_scale], np.float32).view(np.uint8))
        tensors = TensorList([inputs + o for o in offsets[:-1]], [outputs + o for o in offsets[:-1]],
                             sizes, [TYPE_CODES[kind]] * len(sizes))
        plan = harness.plan(sizes, [TYPE_CODES[kind]] * len(sizes), chunk_elements, max_tensors)
        kernel_ms, host_ms = harness.time_unscale(tensors, scalars, scalars + 4, iterations,
                                                  chunk_elements, max_tensors)
        copy_target = harness.malloc(arena.nbytes) if in_place else outputs
        try:
            copy_ms = harness.time_copy(copy_target, inputs, sum(nbytes), iterations)
        finally:
            if in_place:
                harness.free(copy_target)
    finally:
        harness.free(scalars)
        harness.free(inputs)
        if not in_place:
            harness.free(outputs)
    return BandwidthRow(label, len(sizes), sum(sizes), sum(nbytes), plan.launches, plan.blocks,
                        plan.table_bytes, kernel_ms, host_ms, copy_ms, None, None)


def table_cell(table_bytes: int) -> str:
    """A launch table's size in KB, as the kernel-parameter limits are spoken of (4K, 32K)."""
    return f"{-(-table_bytes // 1024)}K"


def _ratio_cell(value: Optional[float]) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _ms_cell(value: Optional[float]) -> str:
    return f"{value:.4f}" if value is not None else "-"


def format_rows(rows: Sequence[BandwidthRow], target: float = TARGET_RATIO,
                pytorch_target: float = PYTORCH_TARGET) -> List[str]:
    """A table, one line per row, with the verdicts against ``target`` (vs memcpy) and, where
    PyTorch was timed, ``pytorch_target``."""
    header = (f"{'gradients':<30} {'tensors':>7} {'MB':>7} {'launch':>6} {'table':>5} "
              f"{'blocks':>6} "
              f"{'ours ms':>8} {'GB/s':>7} {'memcpy ms':>9} {'vs memcpy':>9} "
              f"{'PyTorch ms':>10} {'vs PyTorch':>10} {'composite ms':>12} {'vs comp.':>8} "
              f"{'host ms':>7}  verdict (>= {target:g}x memcpy, >= {pytorch_target:g}x PyTorch)")
    lines = [header, "-" * len(header)]
    for r in rows:
        misses = []
        if not r.ratio >= target:
            misses.append("memcpy")
        if r.vs_pytorch is not None and not r.vs_pytorch >= pytorch_target:
            misses.append("PyTorch")
        verdict = "ok" if not misses else "BELOW " + "+".join(misses)
        lines.append(f"{r.label:<30} {r.tensors:>7} {r.nbytes / 1e6:>7.1f} {r.launches:>6} "
                     f"{table_cell(r.table_bytes):>5} {r.blocks:>6} {r.kernel_ms:>8.4f} "
                     f"{r.kernel_gbps:>7.0f} {r.copy_ms:>9.4f} {r.ratio:>9.2f} {_ms_cell(r.pytorch_ms):>10} "
                     f"{_ratio_cell(r.vs_pytorch):>10} {_ms_cell(r.composite_ms):>12} "
                     f"{_ratio_cell(r.vs_composite):>8} {r.host_ms:>7.4f}  {verdict}")
    return lines

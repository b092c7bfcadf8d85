"""Time per call of the op's kernel on a model's gradients, against a cudaMemcpy of the same bytes.

The kernel reads and writes every byte once (in place or not), as a device-to-device copy
does, so their bandwidths compare directly:

    moved bytes    = 2 * gradient bytes                      (read + write)
    bandwidth      = moved bytes / time
    ratio          = memcpy time / kernel time               (target >= 0.8)

Gradients sit in one device arena, 256-byte aligned each (as TensorFlow's allocator places
them); the copy moves the same number of bytes, contiguous, from the input arena to the
output arena. Times are device times from CUDA events over back-to-back calls; each call
plans on the host and enqueues, as the TensorFlow kernel does.
"""
from __future__ import annotations

import collections
from typing import List, Optional, Sequence

import numpy as np
from harness_library import KernelHarness, TensorList
from unscale_reference import BITS_DTYPE, ITEMSIZE, TYPE_CODES, from_float32

TARGET_RATIO = 0.8
ALIGNMENT = 256


class BandwidthRow(collections.namedtuple(
        "BandwidthRow", "label tensors elements nbytes launches blocks kernel_ms host_ms "
                        "copy_ms")):
    """One measurement: what ran, and its kernel, host and memcpy times per call (ms)."""

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
        return self.copy_ms / self.kernel_ms if self.kernel_ms > 0 else float("nan")


def moved_gbps(nbytes: int, ms: float) -> float:
    """GB/s (1e9 bytes) of reading and writing ``nbytes`` in ``ms`` milliseconds."""
    return 2 * nbytes / (ms * 1e6) if ms > 0 else float("nan")


def arena_offsets(nbytes: Sequence[int]) -> List[int]:
    """Byte offset of each buffer in an arena, each ALIGNMENT-aligned; last: the arena size."""
    offsets = [0]
    for n in nbytes:
        offsets.append(offsets[-1] + (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)
    return offsets


def measure(harness: KernelHarness, label: str, sizes: Sequence[int], kind: str,
            iterations: int, chunk_elements: Optional[int] = None, in_place: bool = False,
            seed: int = 0) -> BandwidthRow:
    """Times the op on gradients of ``sizes`` elements of ``kind``, and a memcpy of as many bytes."""
    item = ITEMSIZE[kind]
    nbytes = [s * item for s in sizes]
    offsets = arena_offsets(nbytes)
    arena = np.zeros(offsets[-1] // item, BITS_DTYPE[kind])
    values = np.random.default_rng(seed).standard_normal(sum(sizes), dtype=np.float32)
    filled = 0
    for size, offset in zip(sizes, offsets):
        start = offset // item
        arena[start:start + size] = from_float32(kind, values[filled:filled + size])
        filled += size
    inputs = harness.malloc(arena.nbytes)
    outputs = inputs if in_place else harness.malloc(arena.nbytes)
    scalars = harness.malloc(8)
    try:
        harness.upload(inputs, arena)
        inv_scale = 1.0 if in_place else 2.0**-7  # in place: values stay as they are
        harness.upload(scalars, np.array([inv_scale], np.float32).view(np.uint8))
        tensors = TensorList([inputs + o for o in offsets[:-1]], [outputs + o for o in offsets[:-1]],
                             sizes, [TYPE_CODES[kind]] * len(sizes))
        launches, blocks = harness.plan(sizes, [TYPE_CODES[kind]] * len(sizes), chunk_elements)
        kernel_ms, host_ms = harness.time_unscale(tensors, scalars, scalars + 4, iterations,
                                                  chunk_elements)
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
    return BandwidthRow(label, len(sizes), sum(sizes), sum(nbytes), launches, blocks, kernel_ms,
                        host_ms, copy_ms)


def format_rows(rows: Sequence[BandwidthRow], target: float = TARGET_RATIO) -> List[str]:
    """A table, one line per row, with the verdict against ``target``."""
    header = (f"{'gradients':<28} {'tensors':>7} {'MB':>8} {'launches':>8} {'blocks':>7} "
              f"{'kernel ms':>10} {'GB/s':>8} {'memcpy ms':>10} {'GB/s':>8} {'ratio':>6} "
              f"{'host ms':>8}  vs {target:g}x")
    lines = [header, "-" * len(header)]
    for r in rows:
        verdict = "ok" if r.ratio >= target else "BELOW"
        lines.append(f"{r.label:<28} {r.tensors:>7} {r.nbytes / 1e6:>8.1f} {r.launches:>8} "
                     f"{r.blocks:>7} {r.kernel_ms:>10.4f} {r.kernel_gbps:>8.1f} "
                     f"{r.copy_ms:>10.4f} {r.copy_gbps:>8.1f} {r.ratio:>6.2f} "
                     f"{r.host_ms:>8.4f}  {verdict}")
    return lines

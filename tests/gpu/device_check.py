"""Runs the op's kernel on a tensor list in device buffers and checks every byte it wrote.

For each tensor the output buffer is laid out as ``[guard][offset][data][guard]``:

* the data of an out-of-place output starts poisoned (a signalling NaN the kernel never
  writes): an element still holding it after the call was never written;
* the guards (and the misaligning offset) hold a byte pattern: a change there is a write
  outside the tensor;
* in place, an element written twice has been scaled twice: with an inv_scale that changes
  the value, it no longer matches the oracle (the emulation runs threads one after another,
  so the second writer always reads the first one's result);
* out of place, the input must come back unchanged;
* the flag starts with the wrong answer, so it must be both reset and written.

With ``guard_elements=0`` each buffer ends where its data ends, so that a memory checker
(compute-sanitizer, AddressSanitizer) sees reads past the end as out of bounds.
"""
from __future__ import annotations

import collections
from typing import List, Sequence

import numpy as np
from harness_library import KernelHarness, TensorList
from unscale_reference import (
    BITS_DTYPE,
    ITEMSIZE,
    POISON,
    HostTensor,
    expected,
    mismatches,
    unscaled,
)

GUARD_BYTE = 0xA5
MAX_PROBLEMS_PER_CASE = 8


class Layout(collections.namedtuple("Layout", "name in_place misaligned guard_elements")):
    """Where the buffers sit: output = input or not, offsets of 0-7 elements, guard size."""

    __slots__ = ()


LAYOUTS = (
    Layout("aligned", False, False, 16),
    Layout("misaligned", False, True, 16),
    Layout("in_place", True, False, 16),
    Layout("in_place_misaligned", True, True, 16),
)
SANITIZER_LAYOUTS = tuple(layout._replace(name=layout.name + "_unguarded", guard_elements=0)
                          for layout in LAYOUTS)
LAYOUT_BY_NAME = {layout.name: layout for layout in LAYOUTS + SANITIZER_LAYOUTS}

CaseResult = collections.namedtuple("CaseResult", "problems all_finite launches outputs")


class _Buffer:
    """One device allocation: [lead][data][trail], lead and trail filled with GUARD_BYTE."""

    def __init__(self, harness: KernelHarness, data: bytes, lead: int, trail: int):
        self.harness, self.lead, self.size = harness, lead, len(data)
        host = np.full(lead + len(data) + trail, GUARD_BYTE, np.uint8)
        host[lead:lead + len(data)] = np.frombuffer(data, np.uint8)
        self.total = host.size
        self.pointer = harness.malloc(self.total)
        harness.upload(self.pointer, host)

    @property
    def data_pointer(self) -> int:
        return self.pointer + self.lead

    def read(self):
        """(data bytes, lead bytes, trail bytes) as they are on the device now."""
        host = self.harness.download(self.pointer, self.total)
        return (host[self.lead:self.lead + self.size], host[:self.lead],
                host[self.lead + self.size:])

    def free(self):
        self.harness.free(self.pointer)


def _offset(rng, layout: Layout) -> int:
    return int(rng.integers(8)) if layout.misaligned else 0


def _poisoned(tensor: HostTensor) -> bytes:
    return np.full(tensor.size, POISON[tensor.kind], BITS_DTYPE[tensor.kind]).tobytes()


def _guard_problems(index: int, lead: np.ndarray, trail: np.ndarray) -> List[str]:
    problems = []
    for where, guard in (("before", lead), ("after", trail)):
        changed = np.flatnonzero(guard != GUARD_BYTE)
        if changed.size:
            first = int(changed[0]) - (guard.size if where == "before" else 0)
            problems.append(f"tensor {index}: wrote {changed.size} byte(s) {where} its data "
                            f"(first at byte {first} relative to the "
                            f"{'start' if where == 'before' else 'end'})")
    return problems


def _element_problems(index: int, tensor: HostTensor, got: np.ndarray, want: np.ndarray,
                      inv_scale: float, in_place: bool) -> List[str]:
    wrong = mismatches(tensor.kind, got, want)
    if not wrong.size:
        return []
    never_written = wrong[got[wrong] == POISON[tensor.kind]]
    twice = HostTensor(tensor.kind, want)
    scaled_twice = wrong[got[wrong] == unscaled(twice, inv_scale)[wrong]] if in_place else []
    i = int(wrong[0])
    width = 2 * ITEMSIZE[tensor.kind]
    detail = [f"{wrong.size} of {tensor.size} {tensor.kind} elements wrong, first [{i}]: "
              f"got 0x{int(got[i]):0{width}x}, want 0x{int(want[i]):0{width}x} "
              f"(input 0x{int(tensor.bits[i]):0{width}x})"]
    if len(never_written):
        detail.append(f"{len(never_written)} never written (still poisoned, first "
                      f"[{int(never_written[0])}])")
    if len(scaled_twice):
        detail.append(f"{len(scaled_twice)} scaled twice (written more than once, first "
                      f"[{int(scaled_twice[0])}])")
    return [f"tensor {index}: " + "; ".join(detail)]


def run_checked(harness: KernelHarness, tensors: Sequence[HostTensor], inv_scale: float,
                layout: Layout, rng: np.random.Generator, chunk_elements=None,
                max_tensors=None) -> CaseResult:
    """One call of the op on ``tensors`` placed as ``layout`` says; every check above."""
    want, want_finite = expected(tensors, inv_scale)
    guard = layout.guard_elements
    inputs, outputs = [], []
    scalars = harness.malloc(8)  # inv_scale (float32) at 0, all_finite (bool) at 4
    try:
        for tensor in tensors:
            item = ITEMSIZE[tensor.kind]
            lead = (guard + _offset(rng, layout)) * item
            buffer = _Buffer(harness, tensor.bits.tobytes(), lead, guard * item)
            inputs.append(buffer)
            if layout.in_place:
                outputs.append(buffer)
            else:
                lead = (guard + _offset(rng, layout)) * item
                outputs.append(_Buffer(harness, _poisoned(tensor), lead, guard * item))
        wrong_flag = 0 if want_finite else 1
        harness.upload(scalars, np.array([inv_scale], np.float32).view(np.uint8))
        harness.upload(scalars + 4, np.array([wrong_flag, 0, 0, 0], np.uint8))
        tensor_list = TensorList([b.data_pointer for b in inputs], [b.data_pointer for b in outputs],
                                 [t.size for t in tensors], [t.type_code for t in tensors])
        launches = harness.unscale(tensor_list, scalars, scalars + 4, chunk_elements, max_tensors)
        all_finite = bool(harness.download(scalars + 4, 1)[0])
        problems, results = [], []
        if all_finite != want_finite:
            problems.append(f"all_finite is {all_finite}, want {want_finite}")
        for i, (tensor, buffer) in enumerate(zip(tensors, outputs)):
            data, lead_bytes, trail_bytes = buffer.read()
            got = data.view(BITS_DTYPE[tensor.kind])
            results.append(got)
            problems += _guard_problems(i, lead_bytes, trail_bytes)
            problems += _element_problems(i, tensor, got, want[i], inv_scale, layout.in_place)
            if not layout.in_place:
                unchanged = inputs[i].read()[0].view(BITS_DTYPE[tensor.kind])
                if not np.array_equal(unchanged, tensor.bits):
                    problems.append(f"tensor {i}: the input was modified (out-of-place call)")
        if len(problems) > MAX_PROBLEMS_PER_CASE:
            problems = problems[:MAX_PROBLEMS_PER_CASE] + [
                f"... and {len(problems) - MAX_PROBLEMS_PER_CASE} more"]
        return CaseResult(problems, all_finite, launches, results)
    finally:
        for buffer in inputs + ([] if layout.in_place else outputs):
            buffer.free()
        harness.free(scalars)

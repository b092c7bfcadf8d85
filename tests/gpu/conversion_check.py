"""The kernel's element conversions held to one numpy model, bit for bit.

The CUDA kernel converts with the GPU's instructions (cvt.f32.f16, cvt.rn.f16.f32,
cvt.rn.bf16.f32 on sm_80+, and the product __fmul_rn); the CPU kernel with portable bit
arithmetic; the grid emulation with models of the instructions (unscale_element.h). This
module runs each of them through the harness's probe kernel and compares every output with
the numpy model of the instruction:

* on a GPU (``make test-gpu``): the real instructions, and the portable code compiled for the
  device;
* on the grid emulation (``tests/fused_op/test_gpu_conversions.py``): the instruction models
  and the portable code compiled for the host, which is what the CPU kernel runs.

So the host build is proven equal to the device instruction's semantics through the same
model. Inputs: every float16 pattern, and float32 values at and one ulp around every
rounding boundary of float16 and bfloat16 (ties, overflow, subnormal steps, zero, inf, NaN
payloads of both signs).

NaN: an instruction (and its model) writes exactly the canonical NaN (float32 0x7fffffff,
16-bit 0x7fff); the portable code keeps the sign and the payload's top bits (and sets the
quiet bit when it narrows).
"""
from __future__ import annotations

import collections
from typing import List

import numpy as np
from unscale_reference import from_float32, is_nan, require_ieee_denormals, to_float32

CANONICAL_FLOAT_NAN = 0x7FFFFFFF
CANONICAL_HALF_NAN = 0x7FFF
NAN_PAYLOADS = (0x00000001, 0x00001FFF, 0x00002000, 0x0000FFFF, 0x00010000, 0x00400000,
                0x003FFFFF, 0x007FFFFF, 0x00200001)
MUL_SCALES = (1.0, 0.5, 2.0**-7, 3.0, 1 / 3, 2.0**-24, 65536.0)

Conversion = collections.namedtuple("Conversion", "code name in_dtype out_dtype instruction")
CONVERSIONS = (
    Conversion(0, "cvt.f32.f16", np.uint16, np.uint32, True),
    Conversion(1, "cvt.rn.f16.f32", np.uint32, np.uint16, True),
    Conversion(2, "cvt.rn.bf16.f32", np.uint32, np.uint16, True),
    Conversion(3, "mul.rn.f32", np.uint32, np.uint32, True),
    Conversion(4, "portable half -> float", np.uint16, np.uint32, False),
    Conversion(5, "portable float -> half", np.uint32, np.uint16, False),
    Conversion(6, "portable float -> bfloat16", np.uint32, np.uint16, False),
)
ConversionResult = collections.namedtuple(
    "ConversionResult", "conversion inputs mismatches first nan_outputs note")


def every_half_pattern() -> np.ndarray:
    return np.arange(2**16, dtype=np.uint16)


def float32_boundaries() -> np.ndarray:
    """float32 bit patterns at and around every float16 and bfloat16 rounding boundary."""
    def around(bits: np.ndarray) -> List[np.ndarray]:
        bits = bits.astype(np.int64)
        return [bits - 1, bits, bits + 1]

    high13 = np.arange(2**19, dtype=np.int64) << 13  # sign, exponent, the half's 10 bits
    high16 = np.arange(2**16, dtype=np.int64) << 16  # sign, exponent, bfloat16's 7 bits
    parts = [high13, high13 | 0x1000, high13 | 0x0FFF, high13 | 0x1001, high13 | 0x1FFF,
             high16, high16 | 0x8000, high16 | 0x7FFF, high16 | 0x8001, high16 | 0xFFFF]
    # Half subnormals: steps of 2^-24, so ties at (k + 1/2) * 2^-24, below 2^-14.
    steps = (np.arange(2**10 + 1, dtype=np.float64) + 0.5) * 2.0**-24
    parts += around(steps.astype(np.float32).view(np.uint32))
    parts += around(np.array([0x477FF000, 0x477FE000, 0x7F7F8000, 0x33000000], np.int64))
    nans = np.array([0x7F800000 | p for p in NAN_PAYLOADS], np.int64)
    parts += [nans, np.array([0x7F800000, 0, 1, 0x007FFFFF, 0x00800000], np.int64)]
    bits = np.concatenate(parts) & 0xFFFFFFFF
    bits = np.concatenate([bits, bits ^ 0x80000000])  # both signs
    return np.unique(bits).astype(np.uint32)


def half_to_float(bits: np.ndarray, canonical_nan: bool) -> np.ndarray:
    out = to_float32("float16", bits).view(np.uint32)
    nan = is_nan("float16", bits)
    if canonical_nan:
        return np.where(nan, np.uint32(CANONICAL_FLOAT_NAN), out)
    # Portable: sign and payload moved into place, as they are (the multiply quiets it).
    wide = bits.astype(np.uint32)
    portable = ((wide & 0x8000) << 16) | 0x7F800000 | ((wide & 0x3FF) << 13)
    return np.where(nan, portable, out)


def float_to_half(bits: np.ndarray, canonical_nan: bool) -> np.ndarray:
    out = from_float32("float16", bits.view(np.float32))
    nan = is_nan("float32", bits)
    if canonical_nan:
        return np.where(nan, np.uint16(CANONICAL_HALF_NAN), out)
    # Portable: sign, quiet bit and the payload's top bits (numpy does not set the quiet bit).
    portable = (((bits >> 16) & 0x8000) | 0x7E00 | ((bits >> 13) & 0x3FF)).astype(np.uint16)
    return np.where(nan, portable, out)


def float_to_bfloat16(bits: np.ndarray, canonical_nan: bool) -> np.ndarray:
    out = from_float32("bfloat16", bits.view(np.float32))  # NaN: the portable quiet NaN
    if canonical_nan:
        return np.where(is_nan("float32", bits), np.uint16(CANONICAL_HALF_NAN), out)
    return out


def multiply(bits: np.ndarray, scale: float) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        product = (bits.view(np.float32) * np.float32(scale)).view(np.uint32)
    return np.where(is_nan("float32", product), np.uint32(CANONICAL_FLOAT_NAN), product)


def model(conversion: Conversion, inputs: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """What ``conversion`` must write for ``inputs`` (bits), NaN bits included."""
    canonical = conversion.instruction
    if conversion.code in (0, 4):
        return half_to_float(inputs, canonical)
    if conversion.code in (1, 5):
        return float_to_half(inputs, canonical)
    if conversion.code in (2, 6):
        return float_to_bfloat16(inputs, canonical)
    return multiply(inputs, scale)


def check_conversions(harness, major: int) -> List[ConversionResult]:
    """Every conversion of the probe kernel on every input, against the model."""
    require_ieee_denormals()
    halves, floats = every_half_pattern(), float32_boundaries()
    results = []
    for conversion in CONVERSIONS:
        inputs = halves if conversion.in_dtype is np.uint16 else floats
        scales = MUL_SCALES if conversion.code == 3 else (1.0,)
        note = ""
        if conversion.code == 2 and major < 8:
            note = f"sm_{major}x has no such instruction: the model runs (the kernel's portable path)"
        mismatched, first, nan_outputs, count = 0, "", set(), 0
        for scale in scales:
            got = harness.convert(conversion.code, inputs, conversion.out_dtype, scale)
            want = model(conversion, inputs, scale)
            count += inputs.size
            wrong = np.flatnonzero(got != want)
            if wrong.size and not first:
                i = int(wrong[0])
                width = 2 * np.dtype(conversion.out_dtype).itemsize
                first = (f"input 0x{int(inputs[i]):0{2 * inputs.itemsize}x} (x {scale:g}): got "
                         f"0x{int(got[i]):0{width}x}, want 0x{int(want[i]):0{width}x}")
            mismatched += wrong.size
            out_nan = (got & (0x7FFFFFFF if got.itemsize == 4 else 0x7FFF)) > \
                (0x7F800000 if got.itemsize == 4 else (0x7C00 if conversion.code in (1, 5)
                                                         else 0x7F80))
            nan_outputs.update(int(v) for v in np.unique(got[out_nan])[:4])
        results.append(ConversionResult(conversion, count, mismatched, first,
                                        sorted(nan_outputs), note))
    return results


def format_results(results: List[ConversionResult]) -> List[str]:
    header = f"{'conversion':<28} {'inputs':>9} {'mismatches':>10}  NaN outputs seen"
    lines = [header, "-" * len(header)]
    for r in results:
        nans = ", ".join(f"0x{v:x}" for v in r.nan_outputs[:4]) or "-"
        line = f"{r.conversion.name:<28} {r.inputs:>9} {r.mismatches:>10}  {nans}"
        if r.first:
            line += f"   first: {r.first}"
        if r.note:
            line += f"   ({r.note})"
        lines.append(line)
    return lines

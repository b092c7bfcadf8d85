"""Values and the bit-for-bit check for RoundToHalf against TensorFlow's Cast pair.

``assert_rounds_like_casts(bits, want, got, half)``: ``got`` (RoundToHalf) holds ``want``'s
bits (TensorFlow's ``Cast(Cast(x, half), float32)``) for the float32 values with ``bits``.
Two differences are by design, both in nan payloads:

* TensorFlow 2.x's bfloat16 Cast keeps a negative nan's sign only in the scalar loop over a
  tensor's last (size mod 8) elements, +nan in its vector loop; RoundToHalf gives +nan
  everywhere (custom_ops/round_to_half/round_element.h).
* RoundToHalf's float16 nans are the canonical quiet nan with the input's sign, as
  TensorFlow up to 2.19's Cast pair gives; TensorFlow 2.21's float16 Cast keeps the top ten
  payload bits (quieted), as IEEE conversions do.  A nan stays a nan of the same sign
  either way; only its payload may differ, and only from such a TensorFlow.
"""
from __future__ import annotations

import numpy as np

QUIET_NAN = 0x7FC00000
SIGN = 0x80000000
SPECIAL_BITS = np.array([
    0x00000000, 0x80000000,              # +-0
    0x7F800000, 0xFF800000,              # +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345, 0x7FFFFFFF, 0x7FA00000,  # nans, quiet and signalling
    0x00000001, 0x807FFFFF, 0x00400000,  # float32 subnormals
    0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,  # float32's smallest normal and largest finite
    0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000,  # 65504, 65519.99 -> 65504, +-65520 -> +-inf
    0x33800000, 0x33000000, 0x33000001, 0x33400000,  # 2^-24 stays, 2^-25 ties to 0, above it rounds up
    0x38800000, 0x387FC000, 0x387FE000,  # 2^-14 and the subnormal / normal boundary
    0x3F801000, 0x3F803000, 0x3F808000, 0x3F818000,  # float16 and bfloat16 ties to even
    0x7F7F8000, 0x7F7F7FFF,              # bfloat16's overflow to inf, and just below
], np.uint32)


def specials_at_every_position(sizes):
    """Tensors of each size in ``sizes``; across them every special sits at every position."""
    return [SPECIAL_BITS[(np.arange(size) + shift) % len(SPECIAL_BITS)]
            for size in sizes for shift in range(len(SPECIAL_BITS))]


def random_bits(rng, shape):
    """Uniform float32 bit patterns: every sign and exponent, nans and subnormals included."""
    return rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)


def assert_rounds_like_casts(bits, want, got, half):
    """See the module docstring; ``half`` is ``"float16"`` or ``"bfloat16"``."""
    want, got = np.asarray(want).view(np.uint32), np.asarray(got).view(np.uint32)
    nan = (want & 0x7FFFFFFF) > 0x7F800000
    assert np.array_equal(nan, (got & 0x7FFFFFFF) > 0x7F800000)
    assert np.all(want[nan] & np.uint32(QUIET_NAN) == QUIET_NAN), "the Cast pair's nans are not quiet"
    if half == "bfloat16":
        assert np.all(got[nan] == QUIET_NAN)
        want = np.where(nan, np.uint32(QUIET_NAN), want)
    else:  # the canonical quiet nan, with the sign the Cast pair keeps (module docstring)
        want = np.where(nan, (want & np.uint32(SIGN)) | np.uint32(QUIET_NAN), want)
    different = np.flatnonzero(want != got)
    assert different.size == 0, ["%08x: Cast pair %08x, RoundToHalf %08x" % (
        bits.flat[i], want.flat[i], got.flat[i]) for i in different[:8]]

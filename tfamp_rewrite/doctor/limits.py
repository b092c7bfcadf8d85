"""What a half type can hold: its largest finite value and its smallest normal and subnormal.

Magnitudes are compared by their float32 exponent ``e`` (``2**e <= |x| < 2**(e+1)``):

* float16: largest finite 65504; normal down to ``2**-14`` (below that only subnormals,
  with fewer significant bits); the smallest subnormal is ``2**-24`` -- smaller values
  become 0 or ``2**-24`` (under half of it they flush to zero).
* bfloat16: float32's exponent range: largest finite about ``3.39e38``; normal down to
  ``2**-126``, subnormal down to ``2**-133``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HalfLimits:
    """The representable range of one half type."""

    dtype: str
    max_finite: float
    min_normal_log2: int        # values below 2**min_normal_log2 are subnormal
    min_subnormal_log2: int     # values below 2**min_subnormal_log2 are lost (0, or one bit)

    def describe(self) -> str:
        return "%s: largest %.6g, normal from 2^%d, subnormal from 2^%d" % (
            self.dtype, self.max_finite, self.min_normal_log2, self.min_subnormal_log2)


LIMITS = {
    "float16": HalfLimits("float16", 65504.0, -14, -24),
    "bfloat16": HalfLimits("bfloat16", 3.3895313892515355e38, -126, -133),
}


def limits_for(dtype: str) -> HalfLimits:
    """The limits of ``"float16"`` or ``"bfloat16"``; ValueError otherwise."""
    try:
        return LIMITS[dtype]
    except KeyError:
        raise ValueError("dtype=%r has no half limits; use 'float16' or 'bfloat16'" % (dtype,)) from None

// Per-element logic of RoundToHalf: one float32 value rounded to float16 or bfloat16 and
// widened back, as TensorFlow's CPU Cast pair `Cast(Cast(x, half), float32)` computes it.
// It works on the float32 bits and stays in float32 (no half encoding in between):
//
//   float16, |x| >= 2^-14:  drop 13 mantissa bits, rounding to nearest even (a carry rolls
//                           into the exponent); |x| >= 65520 (half-way past 65504) -> inf
//   float16, |x| <  2^-14:  (|x| + 0.5f) - 0.5f: 0.5f's ulp is 2^-24, float16's subnormal
//                           step, so the hardware rounds to it (ties to even; 2^-25 -> 0)
//   bfloat16:               drop 16 mantissa bits, rounding to nearest even (overflow -> inf)
//   sign:                   kept (-0 stays -0)
//   nan:                    the canonical quiet nan TensorFlow's Cast produces -- float16:
//                           sign kept, payload dropped (0x7fc00000 | sign); bfloat16: +0x7fc00000
//
// TensorFlow's float16 Cast (Eigen's float_to_half_rtne) maps every nan to 0x7e00 | sign.
// Its bfloat16 Cast (Eigen's vectorised F32ToBf16) maps every nan to 0x7fc0, except in the
// scalar loop over a tensor's last (size mod 8) elements, which keeps a negative nan's
// sign: that one case is position-dependent there, and RoundToHalf does not copy it.
// Branch-free (selects only), so the portable loop vectorises.
#ifndef TFAMP_ROUND_ELEMENT_H_
#define TFAMP_ROUND_ELEMENT_H_

#include <cstdint>

#include "../unscale_and_check_finite/unscale_element.h"

namespace tfamp {

const uint32_t kFloatAbsMask = 0x7fffffffu;
const uint32_t kFloatInfBits = 0x7f800000u;
const uint32_t kQuietNanBits = 0x7fc00000u;
const uint32_t kFloatSignBit = 0x80000000u;

const uint32_t kHalfOverflowBits = 0x477ff000u;  // 65520: rounds to inf in float16
const uint32_t kHalfMinNormalBits = 0x38800000u;  // 2^-14

template <ElementType kType>
inline uint32_t RoundElement(uint32_t x);

template <>
inline uint32_t RoundElement<kFloat16>(uint32_t x) {
  const uint32_t magnitude = x & kFloatAbsMask;
  uint32_t normal = (magnitude + 0xfffu + ((magnitude >> 13) & 1u)) & ~0x1fffu;
  normal = magnitude >= kHalfOverflowBits ? kFloatInfBits : normal;
  const uint32_t subnormal = FloatBits((BitsToFloat(magnitude) + 0.5f) - 0.5f);
  const uint32_t rounded = (magnitude < kHalfMinNormalBits ? subnormal : normal) | (x & kFloatSignBit);
  return magnitude > kFloatInfBits ? (x & kFloatSignBit) | kQuietNanBits : rounded;
}

template <>
inline uint32_t RoundElement<kBFloat16>(uint32_t x) {
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
  return (x & kFloatAbsMask) > kFloatInfBits ? kQuietNanBits : rounded;
}

}  // namespace tfamp

#endif  // TFAMP_ROUND_ELEMENT_H_

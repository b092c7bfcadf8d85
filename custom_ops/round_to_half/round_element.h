// Per-element logic of RoundToHalf: one float32 value rounded to float16 or bfloat16 and
// widened back, as TensorFlow's CPU Cast pair `Cast(Cast(x, half), float32)` computes it.
//
//   finite or inf:  the half type's round-to-nearest-even conversion and its exact widening
//                   (unscale_element.h's Element<>, the code UnscaleAndCheckFinite rounds with)
//   nan:            the canonical quiet nan TensorFlow's Cast produces -- float16: sign kept,
//                   payload dropped (0x7fc00000 | sign); bfloat16: always +0x7fc00000
//
// TensorFlow's float16 Cast (Eigen's float_to_half_rtne) maps every nan to 0x7e00 | sign.
// Its bfloat16 Cast (Eigen's vectorised F32ToBf16) maps every nan to 0x7fc0, except in the
// scalar loop over a tensor's last (size mod 8) elements, which keeps a negative nan's
// sign: that one case is position-dependent there, and RoundToHalf does not copy it.
#ifndef TFAMP_ROUND_ELEMENT_H_
#define TFAMP_ROUND_ELEMENT_H_

#include <cstdint>

#include "../unscale_and_check_finite/unscale_element.h"

namespace tfamp {

const uint32_t kFloatAbsMask = 0x7fffffffu;
const uint32_t kFloatInfBits = 0x7f800000u;
const uint32_t kQuietNanBits = 0x7fc00000u;
const uint32_t kFloatSignBit = 0x80000000u;

// The float32 bits of TensorFlow's Cast pair for the nan with bits `x`.
template <ElementType kType>
inline uint32_t CanonicalNan(uint32_t x);

template <>
inline uint32_t CanonicalNan<kFloat16>(uint32_t x) {
  return (x & kFloatSignBit) | kQuietNanBits;
}

template <>
inline uint32_t CanonicalNan<kBFloat16>(uint32_t) {
  return kQuietNanBits;
}

// float32 bits -> the float32 bits of that value rounded to kType (kFloat16 or kBFloat16).
template <ElementType kType>
inline uint32_t RoundElement(uint32_t x) {
  typedef Element<kType> E;
  const uint32_t rounded = FloatBits(E::ToFloat(E::FromFloat(BitsToFloat(x))));
  return (x & kFloatAbsMask) > kFloatInfBits ? CanonicalNan<kType>(x) : rounded;
}

}  // namespace tfamp

#endif  // TFAMP_ROUND_ELEMENT_H_

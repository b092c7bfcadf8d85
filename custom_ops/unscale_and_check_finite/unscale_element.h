// Per-element logic of UnscaleAndCheckFinite, shared by the CPU and the CUDA kernel.
//
// Contract, for one element `x` of a gradient stored as float32, float16 or bfloat16:
//   output      = round_to_storage_type(float32(x) * inv_scale)   (inf and nan propagate)
//   non-finite  = x is inf or nan                                   (checked on the input)
// Rounding is IEEE round-to-nearest-even with overflow to inf, as TensorFlow's Cast does,
// so the op returns bit for bit what the composite `cast(cast(x, f32) * s, dtype)` returns.
//
// Two builds of each conversion:
//   * host (the CPU kernel): portable bit arithmetic on the raw storage bits, branch-free
//     (selects only), so the CPU loop vectorises;
//   * device (the CUDA kernel): the GPU's conversion instructions, one each where the bit
//     arithmetic costs about twenty and made the half path compute-bound: cvt.f32.f16 and
//     cvt.rn.f16.f32 everywhere, cvt.rn.bf16.f32 on sm_80 and newer (sm_75 has none and keeps
//     the portable rounding).
// They agree bit for bit on every non-NaN value. NaN outputs differ, as TensorFlow's own Cast
// does between its CPU and GPU kernels: the CPU kernel keeps the payload (x86 arithmetic
// does, so TF's CPU composite does too); the device writes the one NaN TF's GPU composite
// writes, since the GPU's multiply returns the canonical NaN 0x7fffffff: float32 0x7fffffff,
// float16 0x7fff (cvt.rn.f16.f32, the instruction behind Eigen's __float2half), bfloat16
// 0x7fc0 (Eigen's float_to_bfloat16_rtne, which TF's GPU Cast runs).
//
// The CPU grid emulation (tests/gpu/emulation) compiles the device code as C++, with
// TFAMP_CUDA_EMULATION defined: there each instruction is its model below (Cvt*), which
// tests/gpu/conversion_check.py holds to the instruction, bit for bit, on a real GPU.
// Plain C++11 plus CUDA qualifiers and inline PTX: no TensorFlow, Eigen or cuda_fp16 headers.
#ifndef TFAMP_UNSCALE_ELEMENT_H_
#define TFAMP_UNSCALE_ELEMENT_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TFAMP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TFAMP_HOST_DEVICE inline
#endif

namespace tfamp {

// Storage type of one gradient tensor; the values index the kernels' dispatch tables.
enum ElementType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Bytes of one element of storage type `type`.
TFAMP_HOST_DEVICE int ElementBytes(ElementType type) { return type == kFloat32 ? 4 : 2; }

TFAMP_HOST_DEVICE uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

TFAMP_HOST_DEVICE float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// x * s rounded once to float32. On the device the intrinsic keeps nvcc from contracting
// the product with a later addition into an FMA (which would round differently); host
// builds pass -ffp-contract=off for the same reason.
TFAMP_HOST_DEVICE float MulRoundedToFloat(float x, float s) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, s);
#else
  return x * s;
#endif
}

TFAMP_HOST_DEVICE bool IsNaN(float f) { return (FloatBits(f) & 0x7fffffffu) > 0x7f800000u; }

template <ElementType kType>
struct Element;

template <>
struct Element<kFloat32> {
  typedef uint32_t Bits;
  static TFAMP_HOST_DEVICE bool IsNonFinite(Bits b) { return (b & 0x7f800000u) == 0x7f800000u; }
  static TFAMP_HOST_DEVICE float ToFloat(Bits b) { return BitsToFloat(b); }
  static TFAMP_HOST_DEVICE Bits FromFloat(float f) { return FloatBits(f); }
  static TFAMP_HOST_DEVICE Bits FromNonNaNFloat(float f) { return FromFloat(f); }
  // ExponentCarries (below): the exponent field of each lane, its low bit, the lanes' top bits.
  static const uint32_t kExponentMask = 0x7f800000u;
  static const uint32_t kExponentLowBit = 0x00800000u;
  static const uint32_t kLaneTopBits = 0x80000000u;
};

// --- portable conversions (the CPU kernel; the device where no instruction exists) ---------

TFAMP_HOST_DEVICE float PortableHalfToFloat(uint16_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x8000u) << 16;
  const uint32_t magnitude = b & 0x7fffu;
  // Normal numbers, inf and nan: move exponent and mantissa into place and rebias the
  // exponent (15 -> 127); inf/nan need the all-ones float exponent, one more +112.
  const uint32_t rebiased = (magnitude << 13) + (112u << 23);
  const uint32_t wide = magnitude >= 0x7c00u ? rebiased + (112u << 23) : rebiased;
  // Subnormals and zero are mantissa * 2^-24, exact in float32 and a normal float.
  const uint32_t subnormal = FloatBits(static_cast<float>(magnitude) * 5.9604644775390625e-8f);
  return BitsToFloat((magnitude < 0x0400u ? subnormal : wide) | sign);
}

// Round to nearest even; NaN keeps its sign and top payload bits and becomes quiet.
TFAMP_HOST_DEVICE uint16_t PortableHalfFromFloat(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t magnitude = x & 0x7fffffffu;
  // Normal half range: rebias (127 -> 15) and round the 13 dropped bits to nearest even;
  // a carry rolls into the exponent, and everything at or above 65520 becomes inf (0x7c00).
  const uint32_t odd = (magnitude >> 13) & 1u;
  uint32_t normal = (magnitude - (112u << 23) + 0xfffu + odd) >> 13;
  normal = normal < 0x7c00u ? normal : 0x7c00u;
  // Below 2^-14 the result is subnormal: adding 0.5f (whose ulp is 2^-24, the half
  // subnormal step) rounds to nearest even in hardware; the mantissa is the count of steps.
  const uint32_t subnormal = FloatBits(BitsToFloat(magnitude) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  uint32_t h = magnitude < 0x38800000u ? subnormal : normal;
  h = magnitude > 0x7f800000u ? nan : h;
  return static_cast<uint16_t>(h | sign);
}

// Round the 16 dropped bits to nearest even (overflow rounds into inf naturally); NaN keeps
// its sign and payload's top bits and becomes quiet.
TFAMP_HOST_DEVICE uint16_t PortableBfloat16FromFloat(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return static_cast<uint16_t>(IsNaN(f) ? quiet_nan : rounded);
}

// --- the device's conversion instructions, and their models --------------------------------
// On a real device each is one PTX instruction. Elsewhere (host compilers: the grid emulation,
// the harness's reference) it is the model of that instruction: the portable conversion, with
// NaN results canonical, as the GPU returns them (tests/gpu/conversion_check.py checks the
// model against the instruction over every float16 and every float32 rounding boundary).
#if defined(__CUDA_ARCH__) && !defined(TFAMP_CUDA_EMULATION)
#define TFAMP_DEVICE_INSTRUCTIONS 1
#endif

const uint32_t kCanonicalFloatNaN = 0x7fffffffu;  // what a GPU's float arithmetic returns
const uint16_t kCanonicalHalfNaN = 0x7fffu;       // cvt.rn.{f16,bf16}.f32 of any NaN
const uint16_t kEigenBfloat16NaN = 0x7fc0u;       // Eigen's float_to_bfloat16_rtne of +NaN

// cvt.f32.f16: exact (subnormal halves included); any NaN gives the canonical float NaN.
TFAMP_HOST_DEVICE float CvtF32F16(uint16_t h) {
#if defined(TFAMP_DEVICE_INSTRUCTIONS)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const float f = PortableHalfToFloat(h);
  return (h & 0x7fffu) > 0x7c00u ? BitsToFloat(kCanonicalFloatNaN) : f;
#endif
}

// cvt.rn.f16.f32: round to nearest even, overflow to inf; any NaN gives 0x7fff.
TFAMP_HOST_DEVICE uint16_t CvtRnF16F32(float f) {
#if defined(TFAMP_DEVICE_INSTRUCTIONS)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  return IsNaN(f) ? kCanonicalHalfNaN : PortableHalfFromFloat(f);
#endif
}

// cvt.rn.bf16.f32 (sm_80 and newer): round to nearest even; any NaN gives 0x7fff.
TFAMP_HOST_DEVICE uint16_t CvtRnBf16F32(float f) {
#if defined(TFAMP_DEVICE_INSTRUCTIONS) && __CUDA_ARCH__ >= 800
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  return IsNaN(f) ? kCanonicalHalfNaN : PortableBfloat16FromFloat(f);
#endif
}

// --- per storage type: the host build and the device build ----------------------------------

template <>
struct Element<kFloat16> {
  typedef uint16_t Bits;
  static TFAMP_HOST_DEVICE bool IsNonFinite(Bits b) { return (b & 0x7c00u) == 0x7c00u; }

  static TFAMP_HOST_DEVICE float ToFloat(Bits b) {
#if defined(__CUDA_ARCH__)
    return CvtF32F16(b);
#else
    return PortableHalfToFloat(b);
#endif
  }

  static TFAMP_HOST_DEVICE Bits FromFloat(float f) {
#if defined(__CUDA_ARCH__)
    return CvtRnF16F32(f);
#else
    return PortableHalfFromFloat(f);
#endif
  }
  static TFAMP_HOST_DEVICE Bits FromNonNaNFloat(float f) { return FromFloat(f); }
  static const uint32_t kExponentMask = 0x7c007c00u;
  static const uint32_t kExponentLowBit = 0x04000400u;
  static const uint32_t kLaneTopBits = 0x80008000u;
};

template <>
struct Element<kBFloat16> {
  typedef uint16_t Bits;
  static TFAMP_HOST_DEVICE bool IsNonFinite(Bits b) { return (b & 0x7f80u) == 0x7f80u; }
  // Exact and one instruction (a shift) on every build.
  static TFAMP_HOST_DEVICE float ToFloat(Bits b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

  static TFAMP_HOST_DEVICE Bits FromFloat(float f) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
    const Bits rounded = CvtRnBf16F32(f);
#else
    const Bits rounded = PortableBfloat16FromFloat(f);
#endif
    return IsNaN(f) ? kEigenBfloat16NaN : rounded;
#else
    return PortableBfloat16FromFloat(f);
#endif
  }

  // FromFloat without the NaN select: a NaN comes out as kCanonicalHalfNaN on the device
  // (whose products are canonical NaNs), which the vector path rewrites where it can occur.
  static TFAMP_HOST_DEVICE Bits FromNonNaNFloat(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return CvtRnBf16F32(f);
#else
    return PortableBfloat16FromFloat(f);
#endif
  }
  static const uint32_t kExponentMask = 0x7f807f80u;
  static const uint32_t kExponentLowBit = 0x00800080u;
  static const uint32_t kLaneTopBits = 0x80008000u;
};

// Non-finite test of all lanes of one 32-bit word of storage at once: (w & exponent mask) +
// exponent low bit carries into a lane's top bit (kLaneTopBits) exactly when that lane's
// exponent is all ones (inf or nan), and never into the next lane; the other bits are noise.
// So the OR of many words' carries, masked once with kLaneTopBits, tests every element.
template <ElementType kType>
TFAMP_HOST_DEVICE uint32_t ExponentCarries(uint32_t word) {
  return (word & Element<kType>::kExponentMask) + Element<kType>::kExponentLowBit;
}

// The whole per-element step: returns the unscaled bits and ORs the input's
// non-finiteness into *nonfinite (kept as an integer so loops reduce without branches).
template <ElementType kType>
TFAMP_HOST_DEVICE typename Element<kType>::Bits UnscaleElement(typename Element<kType>::Bits x,
                                                               float inv_scale,
                                                               uint32_t* nonfinite) {
  typedef Element<kType> E;
  *nonfinite |= static_cast<uint32_t>(E::IsNonFinite(x));
  return E::FromFloat(MulRoundedToFloat(E::ToFloat(x), inv_scale));
}

}  // namespace tfamp

#endif  // TFAMP_UNSCALE_ELEMENT_H_

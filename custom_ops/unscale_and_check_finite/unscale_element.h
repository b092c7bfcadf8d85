// Per-element logic of UnscaleAndCheckFinite, shared by the CPU and the CUDA kernel.
//
// Contract, for one element `x` of a gradient stored as float32, float16 or bfloat16:
//   output      = round_to_storage_type(float32(x) * inv_scale)   (inf and nan propagate)
//   non-finite  = x is inf or nan                                   (checked on the input)
// Rounding is IEEE round-to-nearest-even with overflow to inf, as TensorFlow's Cast does,
// so the op returns bit for bit what the composite `cast(cast(x, f32) * s, dtype)` returns.
//
// Everything works on the raw storage bits and is branch-free (selects only), so the CPU
// loop vectorises and the CUDA kernel does not diverge. Plain C++11 plus CUDA qualifiers:
// no TensorFlow, Eigen or cuda_fp16 headers, so both compilers see exactly this code.
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

template <ElementType kType>
struct Element;

template <>
struct Element<kFloat32> {
  typedef uint32_t Bits;
  static TFAMP_HOST_DEVICE bool IsNonFinite(Bits b) { return (b & 0x7f800000u) == 0x7f800000u; }
  static TFAMP_HOST_DEVICE float ToFloat(Bits b) { return BitsToFloat(b); }
  static TFAMP_HOST_DEVICE Bits FromFloat(float f) { return FloatBits(f); }
};

template <>
struct Element<kFloat16> {
  typedef uint16_t Bits;
  static TFAMP_HOST_DEVICE bool IsNonFinite(Bits b) { return (b & 0x7c00u) == 0x7c00u; }

  static TFAMP_HOST_DEVICE float ToFloat(Bits b) {
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

  static TFAMP_HOST_DEVICE Bits FromFloat(float f) {
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
    const uint32_t subnormal =
        FloatBits(BitsToFloat(magnitude) + 0.5f) - 0x3f000000u;
    const uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
    uint32_t h = magnitude < 0x38800000u ? subnormal : normal;
    h = magnitude > 0x7f800000u ? nan : h;
    return static_cast<Bits>(h | sign);
  }
};

template <>
struct Element<kBFloat16> {
  typedef uint16_t Bits;
  static TFAMP_HOST_DEVICE bool IsNonFinite(Bits b) { return (b & 0x7f80u) == 0x7f80u; }
  static TFAMP_HOST_DEVICE float ToFloat(Bits b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

  static TFAMP_HOST_DEVICE Bits FromFloat(float f) {
    const uint32_t x = FloatBits(f);
    // Round the 16 dropped bits to nearest even; overflow rounds into inf naturally.
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (x >> 16) | 0x0040u;
    const bool is_nan = (x & 0x7fffffffu) > 0x7f800000u;
    return static_cast<Bits>(is_nan ? quiet_nan : rounded);
  }
};

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

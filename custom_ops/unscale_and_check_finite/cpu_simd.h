// The CPU kernel's AVX2 and AVX-512 loops: one range of one tensor, 8 or 16 elements per
// instruction, the scalar element logic (unscale_element.h) for the tail.
//
// Bit for bit the scalar contract: the multiply is the same IEEE float32 multiply (and
// obeys the same MXCSR flush-to-zero TensorFlow sets), F16C's conversions are exact
// (half -> float) and round to nearest even with overflow to inf (float -> half), nan
// payloads move as the scalar code moves them, and bfloat16 rounds with the scalar code's
// integer arithmetic. Functions carry their own target attribute: the file compiles for
// baseline x86-64 and these run only where cpu_isa.h found the instructions.
//
// Each function returns nonzero iff an input element was inf or nan; `in` may equal `out`.
#ifndef TFAMP_CPU_SIMD_H_
#define TFAMP_CPU_SIMD_H_

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TFAMP_HAVE_X86_SIMD 1

#include <immintrin.h>

#include <cstdint>

#include "unscale_element.h"

#define TFAMP_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define TFAMP_TARGET_AVX512 __attribute__((target("avx512f,avx2,f16c")))

namespace tfamp {

template <ElementType kType>
inline uint32_t UnscaleTail(const void* in, void* out, int64_t begin, int64_t n, float s) {
  typedef typename Element<kType>::Bits Bits;
  uint32_t nonfinite = 0;
  const Bits* src = static_cast<const Bits*>(in);
  Bits* dst = static_cast<Bits*>(out);
  for (int64_t i = begin; i < n; ++i) dst[i] = UnscaleElement<kType>(src[i], s, &nonfinite);
  return nonfinite;
}

// ---- AVX2 ------------------------------------------------------------------------------

TFAMP_TARGET_AVX2 inline uint32_t UnscaleFloat32Avx2(const void* in, void* out, int64_t n, float s) {
  const float* src = static_cast<const float*>(in);
  float* dst = static_cast<float*>(out);
  const __m256 scale = _mm256_set1_ps(s);
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    const __m256i e = _mm256_and_si256(_mm256_castps_si256(x), exponent);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exponent));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(x, scale));
  }
  return static_cast<uint32_t>(!_mm256_testz_si256(bad, bad)) | UnscaleTail<kFloat32>(in, out, i, n, s);
}

TFAMP_TARGET_AVX2 inline uint32_t UnscaleFloat16Avx2(const void* in, void* out, int64_t n, float s) {
  const uint16_t* src = static_cast<const uint16_t*>(in);
  uint16_t* dst = static_cast<uint16_t*>(out);
  const __m256 scale = _mm256_set1_ps(s);
  const __m128i exponent = _mm_set1_epi16(0x7c00);
  __m128i bad = _mm_setzero_si128();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent));
    const __m256 y = _mm256_mul_ps(_mm256_cvtph_ps(h), scale);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return static_cast<uint32_t>(!_mm_testz_si128(bad, bad)) | UnscaleTail<kFloat16>(in, out, i, n, s);
}

// float32 bits -> bfloat16 bits in the low half of each lane, as Element<kBFloat16>::FromFloat.
TFAMP_TARGET_AVX2 inline __m256i RoundToBFloat16Avx2(__m256i x) {
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

// bfloat16 bits h -> h * s rounded back to bfloat16, in the high half of each 32-bit lane
// of `widened` (h << 16, i.e. h's float32 value); the result is in each lane's low half.
TFAMP_TARGET_AVX2 inline __m256i UnscaleBFloat16LanesAvx2(__m256i widened, __m256 scale) {
  return RoundToBFloat16Avx2(_mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(widened), scale)));
}

TFAMP_TARGET_AVX2 inline uint32_t UnscaleBFloat16Avx2(const void* in, void* out, int64_t n, float s) {
  const uint16_t* src = static_cast<const uint16_t*>(in);
  uint16_t* dst = static_cast<uint16_t*>(out);
  const __m256 scale = _mm256_set1_ps(s);
  const __m256i exponent = _mm256_set1_epi16(0x7f80);
  const __m256i zero = _mm256_setzero_si256();
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  // 16 elements per step. Interleaving with zeros widens them to float32 within each
  // 128-bit half (elements 0-3 and 8-11 low, 4-7 and 12-15 high); packing the two results
  // undoes exactly that order, so no cross-lane permute is needed. The results are
  // <= 0xffff per lane, so the unsigned-saturating pack never saturates.
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(h, exponent), exponent));
    const __m256i low = UnscaleBFloat16LanesAvx2(_mm256_unpacklo_epi16(zero, h), scale);
    const __m256i high = UnscaleBFloat16LanesAvx2(_mm256_unpackhi_epi16(zero, h), scale);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_packus_epi32(low, high));
  }
  return static_cast<uint32_t>(!_mm256_testz_si256(bad, bad)) | UnscaleTail<kBFloat16>(in, out, i, n, s);
}

// ---- AVX-512 ---------------------------------------------------------------------------

TFAMP_TARGET_AVX512 inline uint32_t UnscaleFloat32Avx512(const void* in, void* out, int64_t n, float s) {
  const float* src = static_cast<const float*>(in);
  float* dst = static_cast<float*>(out);
  const __m512 scale = _mm512_set1_ps(s);
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), exponent), exponent);
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(x, scale));
  }
  return static_cast<uint32_t>(bad != 0) | UnscaleTail<kFloat32>(in, out, i, n, s);
}

TFAMP_TARGET_AVX512 inline uint32_t UnscaleFloat16Avx512(const void* in, void* out, int64_t n, float s) {
  const uint16_t* src = static_cast<const uint16_t*>(in);
  uint16_t* dst = static_cast<uint16_t*>(out);
  const __m512 scale = _mm512_set1_ps(s);
  const __m256i exponent = _mm256_set1_epi16(0x7c00);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(h, exponent), exponent));
    const __m512 y = _mm512_mul_ps(_mm512_cvtph_ps(h), scale);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return static_cast<uint32_t>(!_mm256_testz_si256(bad, bad)) | UnscaleTail<kFloat16>(in, out, i, n, s);
}

TFAMP_TARGET_AVX512 inline uint32_t UnscaleBFloat16Avx512(const void* in, void* out, int64_t n, float s) {
  const uint16_t* src = static_cast<const uint16_t*>(in);
  uint16_t* dst = static_cast<uint16_t*>(out);
  const __m512 scale = _mm512_set1_ps(s);
  const __m512i exponent = _mm512_set1_epi32(0x7f80);
  const __m512i one = _mm512_set1_epi32(1);
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, exponent), exponent);
    const __m512i x = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), scale));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), one);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x0040));
    const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                     _mm512_set1_epi32(0x7f800000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet)));
  }
  return static_cast<uint32_t>(bad != 0) | UnscaleTail<kBFloat16>(in, out, i, n, s);
}

}  // namespace tfamp

#endif  // x86-64 with GCC or Clang
#endif  // TFAMP_CPU_SIMD_H_

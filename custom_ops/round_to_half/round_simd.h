// RoundToHalf's AVX2 (+F16C) and AVX-512 loops: 8 or 16 floats per instruction, the scalar
// element logic (round_element.h) for the tail.
//
// Bit for bit the scalar contract: F16C's float -> half conversion rounds to nearest even
// with overflow to inf and keeps half subnormals (whatever MXCSR's flush-to-zero says), its
// half -> float conversion is exact; a nan comes back from the pair quiet, with its sign and
// the top payload bits, which are cleared to the canonical nan. bfloat16 rounds with the
// scalar code's integer arithmetic, directly on the float32 bits. Functions carry their own
// target attribute (cpu_simd.h's): they run only where cpu_isa.h found the instructions.
//
// Each function writes out[0, n) from in[0, n); `in` may equal `out`.
#ifndef TFAMP_ROUND_SIMD_H_
#define TFAMP_ROUND_SIMD_H_

#include "../unscale_and_check_finite/cpu_simd.h"

#if defined(TFAMP_HAVE_X86_SIMD)

#include <immintrin.h>

#include <cstdint>

#include "round_element.h"

namespace tfamp {

const int kToNearestEven = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
const uint32_t kNanPayloadBits = 0x003fffffu;  // all but the quiet bit of a float32 nan

template <ElementType kType>
inline void RoundTail(const uint32_t* in, uint32_t* out, int64_t begin, int64_t n) {
  for (int64_t i = begin; i < n; ++i) out[i] = RoundElement<kType>(in[i]);
}

// ---- AVX2 ------------------------------------------------------------------------------

TFAMP_TARGET_AVX2 inline __m256i NanLanesAvx2(__m256i x) {
  return _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(kFloatAbsMask)),
                            _mm256_set1_epi32(kFloatInfBits));
}

TFAMP_TARGET_AVX2 inline void RoundFloat16Avx2(const uint32_t* in, uint32_t* out, int64_t n) {
  const __m256i payload = _mm256_set1_epi32(kNanPayloadBits);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(reinterpret_cast<const float*>(in + i));
    const __m256i y = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_cvtps_ph(x, kToNearestEven)));
    const __m256i nan_payload = _mm256_and_si256(NanLanesAvx2(y), payload);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_andnot_si256(nan_payload, y));
  }
  RoundTail<kFloat16>(in, out, i, n);
}

TFAMP_TARGET_AVX2 inline void RoundBFloat16Avx2(const uint32_t* in, uint32_t* out, int64_t n) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i half_ulp = _mm256_set1_epi32(0x7fff);
  const __m256i kept = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i quiet_nan = _mm256_set1_epi32(kQuietNanBits);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(x, half_ulp), odd), kept);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_blendv_epi8(rounded, quiet_nan, NanLanesAvx2(x)));
  }
  RoundTail<kBFloat16>(in, out, i, n);
}

// ---- AVX-512 ---------------------------------------------------------------------------

TFAMP_TARGET_AVX512 inline __mmask16 NanLanesAvx512(__m512i x) {
  return _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(kFloatAbsMask)),
                                 _mm512_set1_epi32(kFloatInfBits));
}

TFAMP_TARGET_AVX512 inline void RoundFloat16Avx512(const uint32_t* in, uint32_t* out, int64_t n) {
  const __m512i canonical = _mm512_set1_epi32(static_cast<int>(~kNanPayloadBits));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    const __m512i y = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtps_ph(x, kToNearestEven)));
    _mm512_storeu_si512(out + i, _mm512_mask_and_epi32(y, NanLanesAvx512(y), y, canonical));
  }
  RoundTail<kFloat16>(in, out, i, n);
}

TFAMP_TARGET_AVX512 inline void RoundBFloat16Avx512(const uint32_t* in, uint32_t* out, int64_t n) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i half_ulp = _mm512_set1_epi32(0x7fff);
  const __m512i kept = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i quiet_nan = _mm512_set1_epi32(kQuietNanBits);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = _mm512_loadu_si512(in + i);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), one);
    const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(x, half_ulp), odd), kept);
    _mm512_storeu_si512(out + i, _mm512_mask_blend_epi32(NanLanesAvx512(x), rounded, quiet_nan));
  }
  RoundTail<kBFloat16>(in, out, i, n);
}

}  // namespace tfamp

#endif  // TFAMP_HAVE_X86_SIMD
#endif  // TFAMP_ROUND_SIMD_H_

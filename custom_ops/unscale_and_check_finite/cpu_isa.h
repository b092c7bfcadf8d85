// Which instruction set the CPU kernel runs on: probed once at run time, capped by an
// environment variable, never decided at build time (the library must run on any x86-64).
//
//   avx512  AVX-512F (+F16C): 16 elements per instruction
//   avx2    AVX2 + F16C:       8 elements per instruction
//   scalar  the portable loop (what the compiler makes of it for baseline x86-64 / ARM)
//
// TFAMP_CPU_ISA=scalar|avx2|avx512 caps the choice (a cap above what the CPU has is the
// CPU's best), so one machine can run and measure every path the others take.
#ifndef TFAMP_CPU_ISA_H_
#define TFAMP_CPU_ISA_H_

#include <cstdlib>
#include <cstring>

namespace tfamp {

enum CpuIsa { kScalarIsa = 0, kAvx2Isa = 1, kAvx512Isa = 2 };

inline const char* CpuIsaName(CpuIsa isa) {
  static const char* const kNames[] = {"scalar", "avx2", "avx512"};
  return kNames[isa];
}

// The best path this CPU supports (probed once).
inline CpuIsa DetectedCpuIsa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const CpuIsa detected = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) return kScalarIsa;
    return __builtin_cpu_supports("avx512f") ? kAvx512Isa : kAvx2Isa;
  }();
  return detected;
#else
  return kScalarIsa;
#endif
}

// DetectedCpuIsa(), capped by TFAMP_CPU_ISA when that names a path (else ignored).
inline CpuIsa SelectedCpuIsa() {
  const CpuIsa detected = DetectedCpuIsa();
  const char* cap = std::getenv("TFAMP_CPU_ISA");
  if (cap == nullptr) return detected;
  for (int isa = kScalarIsa; isa <= kAvx512Isa; ++isa) {
    if (std::strcmp(cap, CpuIsaName(static_cast<CpuIsa>(isa))) == 0) {
      return isa < detected ? static_cast<CpuIsa>(isa) : detected;
    }
  }
  return detected;
}

}  // namespace tfamp

#endif  // TFAMP_CPU_ISA_H_

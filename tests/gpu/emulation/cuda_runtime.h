// CPU grid emulation: lets g++ compile a CUDA source file unchanged, as C++, and run its
// kernels on the host. Put this directory first on the include path (it is found as
// <cuda_runtime.h>) and compile the .cu file with `-x c++`.
//
// What it provides:
//   * the qualifiers (__global__, __device__, __host__, __forceinline__, __launch_bounds__)
//     and __CUDACC__ / __CUDA_ARCH__, so shared headers take their device code paths;
//   * threadIdx, blockIdx, blockDim, gridDim, uint4, dim3, and the intrinsics the op uses
//     (__fmul_rn, __float_as_uint, __uint_as_float); TFAMP_CUDA_EMULATION, which makes
//     unscale_element.h use its models of the PTX conversion instructions;
//   * the runtime calls the op and its harness use (cudaMalloc ... cudaEventElapsedTime):
//     "device" memory is host memory, streams and events are synchronous;
//   * TFAMP_KERNEL_LAUNCH(kernel, blocks, threads, stream)(args...), the launch macro of
//     gpu_launch.cu: it checks the launch configuration as CUDA does (errors reported by
//     cudaGetLastError), counts launches and blocks, then runs every thread of every block,
//     one after another, in the order set by SetThreadOrder: shuffled by default, so a
//     kernel whose result depends on which thread runs first fails its tests;
//   * a toolkit and a driver version: CUDART_VERSION is TFAMP_EMULATED_CUDART_VERSION
//     (default 13000, CUDA 13.0), cudaDriverGetVersion answers the emulator's driver_version
//     (default 13000). Kernel parameters are held to their limits: a kernel whose parameters
//     exceed what the toolkit compiles (4 KB before 12.1, else 32,764 bytes) does not
//     compile, and a launch of one over 4 KB fails with cudaErrorNotSupported when the
//     driver is older than 12.1;
//   * stream capture: cudaStreamIsCapturing reports every stream as capturing while the
//     emulator's `capturing` is set (nothing is recorded: launches still run at once).
// Kernels must not use shared memory or __syncthreads (threads run to completion one at a
// time); arithmetic follows IEEE with denormals (nvcc's default, no -ftz), whatever the
// calling thread's MXCSR says.
#ifndef TFAMP_TESTS_CUDA_EMULATION_H_
#define TFAMP_TESTS_CUDA_EMULATION_H_

// Every standard header first: __CUDACC__ changes what some of them declare.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define TFAMP_CUDA_EMULATION 1
#define __CUDACC__ 1
// The architecture the device code is compiled for: -DTFAMP_EMULATED_CUDA_ARCH=900 takes
// the sm_80+ paths (bfloat16 through its conversion instruction's model).
#ifndef TFAMP_EMULATED_CUDA_ARCH
#define TFAMP_EMULATED_CUDA_ARCH 750
#endif
#define __CUDA_ARCH__ TFAMP_EMULATED_CUDA_ARCH
// The toolkit the code is compiled with: -DTFAMP_EMULATED_CUDART_VERSION=11080 is CUDA 11.8,
// which passes no kernel parameters over 4 KB.
#ifndef TFAMP_EMULATED_CUDART_VERSION
#define TFAMP_EMULATED_CUDART_VERSION 13000
#endif
#define CUDART_VERSION TFAMP_EMULATED_CUDART_VERSION
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

// Defined in emulation_capi.cc; set by the launcher before each emulated thread runs.
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// One IEEE product rounded to nearest even: the build passes -ffp-contract=off, so the
// compiler cannot fuse it into an FMA either. A NaN product is the canonical NaN, as a GPU
// returns it (x86 would keep an operand's payload).
inline float __fmul_rn(float a, float b) {
  const float product = a * b;
  return product != product ? __uint_as_float(0x7fffffffu) : product;
}

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotSupported = 801,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUstream_st {};
typedef CUstream_st* cudaStream_t;

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

struct CUevent_st {
  std::chrono::steady_clock::time_point time;
};
typedef CUevent_st* cudaEvent_t;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major;
  int minor;
  int multiProcessorCount;
  int memoryBusWidth;
};

namespace cuda_emulation {

// The order in which a launch runs its (block, thread) pairs.
enum ThreadOrder { kInOrder = 0, kReversed = 1, kShuffled = 2 };

struct LaunchCounters {
  int64_t launches;
  int64_t blocks;
  int64_t threads;
};

struct Emulator {
  ThreadOrder order = kShuffled;
  uint64_t seed = 0;
  bool execute = true;  // false: count launches and check them, run no thread
  LaunchCounters counters = {0, 0, 0};
  cudaError_t last_error = cudaSuccess;
  // What cudaDriverGetVersion answers (harness_library.py: EMULATED_DRIVER_VERSION).
  int driver_version = 13000;
  bool capturing = false;  // what cudaStreamIsCapturing answers for every stream
  // Refuse launches over 4 KB of parameters whatever driver_version says (a driver that
  // misreports what it passes).
  bool refuse_large_launches = false;
};

// One emulator per process: a function-local static, shared by every translation unit.
inline Emulator& State() {
  static Emulator emulator;
  return emulator;
}

inline cudaError_t Fail(cudaError_t error) {
  State().last_error = error;
  return error;
}

// Denormals as the GPU computes them, for the duration of a launch.
class IeeeDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  IeeeDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(0x8000u | 0x0040u)); }
  ~IeeeDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#endif
};

inline bool ValidLaunch(const dim3& grid, const dim3& block) {
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  return grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.x <= 0x7fffffffu &&
         grid.y <= 65535 && grid.z <= 65535 && block.x >= 1 && block.y >= 1 && block.z >= 1 &&
         block.x <= 1024 && block.y <= 1024 && block.z <= 64 && threads <= 1024;
}

inline void SetIndex(uint64_t linear, const dim3& extent, uint3* index) {
  index->x = static_cast<unsigned int>(linear % extent.x);
  index->y = static_cast<unsigned int>(linear / extent.x % extent.y);
  index->z = static_cast<unsigned int>(linear / extent.x / extent.y);
}

// Checks and counts a launch, then runs `thread_body` once per thread of the grid.
template <typename Body>
void RunGrid(const dim3& grid, const dim3& block, const Body& thread_body) {
  Emulator& emulator = State();
  if (!ValidLaunch(grid, block)) {
    Fail(cudaErrorInvalidConfiguration);
    return;
  }
  const uint64_t blocks = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  emulator.counters.launches += 1;
  emulator.counters.blocks += static_cast<int64_t>(blocks);
  emulator.counters.threads += static_cast<int64_t>(blocks * threads);
  if (!emulator.execute) return;
  std::vector<uint64_t> order(blocks * threads);  // block * threads + thread
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (emulator.order == kReversed) std::reverse(order.begin(), order.end());
  if (emulator.order == kShuffled) {
    std::mt19937_64 random(emulator.seed + static_cast<uint64_t>(emulator.counters.launches));
    std::shuffle(order.begin(), order.end(), random);
  }
  const IeeeDenormals ieee;
  gridDim = grid;
  blockDim = block;
  for (const uint64_t pair : order) {
    SetIndex(pair / threads, grid, &blockIdx);
    SetIndex(pair % threads, block, &threadIdx);
    thread_body();
  }
}

// Bytes of a kernel's parameter list, laid out (and padded) as a struct of them.
template <typename... Params>
struct ParamBytes;
template <>
struct ParamBytes<> {
  static constexpr size_t At(size_t offset) { return offset; }
};
template <typename First, typename... Rest>
struct ParamBytes<First, Rest...> {
  static constexpr size_t At(size_t offset) {
    return ParamBytes<Rest...>::At((offset + alignof(First) - 1) / alignof(First) * alignof(First) +
                                   sizeof(First));
  }
};

// The most parameter bytes a kernel may take: 4 KB before CUDA 12.1, then 32,764 (Volta and
// newer, the only GPUs a toolkit that new builds for here).
constexpr size_t kSmallParameterLimit = 4096;
constexpr size_t kToolkitParameterLimit = CUDART_VERSION >= 12010 ? 32764 : kSmallParameterLimit;
constexpr int kLargeParameterDriver = 12010;

// kernel<<<grid, block, 0, stream>>>(args...) as Launch(kernel, grid, block, stream)(args...).
template <typename... Params>
class Launch {
 public:
  static constexpr size_t kParameterBytes = ParamBytes<Params...>::At(0);
  static_assert(kParameterBytes <= kToolkitParameterLimit,
                "kernel parameters exceed what this CUDA version passes (4 KB before 12.1)");

  Launch(void (*kernel)(Params...), dim3 grid, dim3 block) : kernel_(kernel), grid_(grid), block_(block) {}

  template <typename... Args>
  void operator()(const Args&... args) const {
    if (kParameterBytes > kSmallParameterLimit &&
        (State().driver_version < kLargeParameterDriver || State().refuse_large_launches)) {
      Fail(cudaErrorNotSupported);
      return;
    }
    void (*kernel)(Params...) = kernel_;
    // Each thread receives its own copy of the parameters, as from constant memory.
    RunGrid(grid_, block_, [&]() { kernel(args...); });
  }

 private:
  void (*kernel_)(Params...);
  dim3 grid_;
  dim3 block_;
};

template <typename... Params>
Launch<Params...> MakeLaunch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t) {
  return Launch<Params...>(kernel, grid, block);
}

}  // namespace cuda_emulation

#define TFAMP_KERNEL_LAUNCH(kernel, blocks, threads, stream) \
  ::cuda_emulation::MakeLaunch(kernel, blocks, threads, stream)

// --- runtime API: synchronous, "device" memory is host memory ------------------------------

inline cudaError_t cudaGetLastError() {
  const cudaError_t error = cuda_emulation::State().last_error;
  cuda_emulation::State().last_error = cudaSuccess;
  return error;
}

inline cudaError_t cudaPeekAtLastError() { return cuda_emulation::State().last_error; }

inline const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNotSupported:
      return "operation not supported";
  }
  return "unrecognized error code";
}

inline cudaError_t cudaDriverGetVersion(int* version) {
  *version = cuda_emulation::State().driver_version;
  return cudaSuccess;
}

inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

inline cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : cuda_emulation::Fail(cudaErrorInvalidDevice);
}

inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cuda_emulation::Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::strcpy(prop->name, "CPU grid emulation");
  prop->major = __CUDA_ARCH__ / 100;
  prop->minor = __CUDA_ARCH__ % 100 / 10;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

// malloc, so that an address sanitizer build sees each allocation's exact end. Aligned to
// 16 bytes (cudaMalloc: 256), which is all a 16-byte vector path can tell apart.
inline cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  *pointer = std::malloc(bytes ? bytes : 1);
  return *pointer ? cudaSuccess : cuda_emulation::Fail(cudaErrorMemoryAllocation);
}

inline cudaError_t cudaFree(void* pointer) {
  std::free(pointer);
  return cudaSuccess;
}

inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
  return cudaMemcpy(dst, src, bytes, kind);
}

inline cudaError_t cudaMemset(void* pointer, int value, size_t bytes) {
  if (bytes) std::memset(pointer, value, bytes);
  return cudaSuccess;
}

inline cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes,
                                   cudaStream_t = nullptr) {
  return cudaMemset(pointer, value, bytes);
}

inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

inline cudaError_t cudaDeviceReset() { return cudaSuccess; }

inline cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st();
  return cudaSuccess;
}

inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}

inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = cuda_emulation::State().capturing ? cudaStreamCaptureStatusActive
                                              : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

inline cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st();
  return cudaSuccess;
}

inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t = nullptr) {
  event->time = std::chrono::steady_clock::now();
  return cudaSuccess;
}

inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

#endif  // TFAMP_TESTS_CUDA_EMULATION_H_

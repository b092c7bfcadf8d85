// C entry points of the kernel harness (tests/gpu/harness_library.py loads them with ctypes):
// device memory, the op's launch sequence (PlanLaunches + EnqueueUnscaleAndCheckFinite, as
// gpu_kernel.cc calls them, without TensorFlow), event timing, and a probe kernel that runs
// the element conversions of unscale_element.h on the device (tests/gpu/conversion_check.py).
//
// Built twice from this one file: by nvcc with gpu_launch.cu and launch_plan.cc for a real
// GPU, and by g++ against tests/gpu/emulation/cuda_runtime.h for the CPU grid emulation.
// Every function returns 0 on success, -1 on failure with tfamp_harness_error() saying why.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_launch.h"
#include "launch_plan.h"
#include "unscale_element.h"

#ifndef TFAMP_KERNEL_LAUNCH
#define TFAMP_KERNEL_LAUNCH(kernel, blocks, threads, stream) kernel<<<blocks, threads, 0, stream>>>
#endif

namespace {

std::string& LastError() {
  static std::string error;
  return error;
}

int Fail(const std::string& what) {
  LastError() = what;
  return -1;
}

int Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return 0;
  return Fail(std::string(what) + ": " + cudaGetErrorString(error));
}

std::vector<tfamp::TensorRef> Tensors(const uint64_t* in, const uint64_t* out,
                                      const int64_t* sizes, const int32_t* types, int n) {
  std::vector<tfamp::TensorRef> tensors(n);
  for (int i = 0; i < n; ++i) {
    tensors[i].in = reinterpret_cast<const void*>(static_cast<uintptr_t>(in[i]));
    tensors[i].out = reinterpret_cast<void*>(static_cast<uintptr_t>(out[i]));
    tensors[i].size = sizes[i];
    tensors[i].type = static_cast<tfamp::ElementType>(types[i]);
  }
  return tensors;
}

// What UnscaleAndCheckFiniteGpuOp::Unscale does: plan on the host, enqueue, no waiting.
int PlanAndEnqueue(const std::vector<tfamp::TensorRef>& tensors, int64_t chunk_elements,
                   int max_tensors, const float* inv_scale, bool* all_finite, int* launches) {
  const char* error = tfamp::EnqueueUnscaleAndCheckFinite(
      tensors.data(), static_cast<int>(tensors.size()), chunk_elements, max_tensors, inv_scale,
      all_finite, nullptr, launches);
  return error ? Fail(std::string("EnqueueUnscaleAndCheckFinite: ") + error) : 0;
}

// max_tensors is tfamp::kMostTensorsAllowed (what the op passes) or a lower limit.
int CheckPlanArguments(int64_t chunk_elements, int max_tensors) {
  if (chunk_elements < 1) return Fail("chunk_elements must be >= 1");
  const int most = tfamp::MaxTensorsPerLaunch(nullptr);
  if (max_tensors != tfamp::kMostTensorsAllowed && (max_tensors < 1 || max_tensors > most)) {
    return Fail("max_tensors must be in [1, " + std::to_string(most) + "]");
  }
  return 0;
}

// The launches and blocks of a plan in `Table`s, and the table's size in bytes.
template <class Table>
void DescribePlan(const std::vector<tfamp::TensorRef>& tensors, int64_t chunk_elements,
                  int max_tensors, int* launches, int64_t* blocks, int* table_bytes) {
  const std::vector<Table> plan = tfamp::PlanLaunches<Table>(
      tensors.data(), static_cast<int>(tensors.size()), chunk_elements, max_tensors);
  *launches = static_cast<int>(plan.size());
  *blocks = 0;
  for (const Table& table : plan) *blocks += table.num_blocks;
  *table_bytes = static_cast<int>(sizeof(Table));
}

// What the probe kernel runs on each input (tfamp_harness_convert). The instructions are
// the real ones on a GPU and their models in the grid emulation (unscale_element.h: Cvt*);
// the portable conversions are the CPU kernel's code, here compiled for the device (GPU) or
// the host (emulation).
enum Conversion {
  kCvtF32F16 = 0,          // uint16 -> uint32
  kCvtRnF16F32 = 1,        // uint32 -> uint16
  kCvtRnBf16F32 = 2,       // uint32 -> uint16 (the model below sm_80: no such instruction)
  kMulRn = 3,              // uint32 -> uint32: __fmul_rn(x, s)
  kPortableHalfToFloat = 4,
  kPortableHalfFromFloat = 5,
  kPortableBfloat16FromFloat = 6,
  kNumConversions = 7,
};

__global__ void ConvertKernel(int conversion, const void* in, void* out, int64_t n, float s) {
  const uint16_t* in16 = static_cast<const uint16_t*>(in);
  const uint32_t* in32 = static_cast<const uint32_t*>(in);
  uint16_t* out16 = static_cast<uint16_t*>(out);
  uint32_t* out32 = static_cast<uint32_t*>(out);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    switch (conversion) {
      case kCvtF32F16: out32[i] = tfamp::FloatBits(tfamp::CvtF32F16(in16[i])); break;
      case kCvtRnF16F32: out16[i] = tfamp::CvtRnF16F32(tfamp::BitsToFloat(in32[i])); break;
      case kCvtRnBf16F32: out16[i] = tfamp::CvtRnBf16F32(tfamp::BitsToFloat(in32[i])); break;
      case kMulRn:
        out32[i] = tfamp::FloatBits(tfamp::MulRoundedToFloat(tfamp::BitsToFloat(in32[i]), s));
        break;
      case kPortableHalfToFloat:
        out32[i] = tfamp::FloatBits(tfamp::PortableHalfToFloat(in16[i]));
        break;
      case kPortableHalfFromFloat:
        out16[i] = tfamp::PortableHalfFromFloat(tfamp::BitsToFloat(in32[i]));
        break;
      case kPortableBfloat16FromFloat:
        out16[i] = tfamp::PortableBfloat16FromFloat(tfamp::BitsToFloat(in32[i]));
        break;
    }
  }
}

}  // namespace

extern "C" {

const char* tfamp_harness_error() { return LastError().c_str(); }

int tfamp_harness_max_tensors_per_launch() { return tfamp::MaxTensorsPerLaunch(nullptr); }

// The slots of the 4 KB and the 32 KB launch table (launch_plan.h).
void tfamp_harness_table_slots(int* small, int* large) {
  *small = tfamp::kSmallTableSlots;
  *large = tfamp::kLargeTableSlots;
}

int64_t tfamp_harness_default_chunk_elements() { return tfamp::kGpuChunkElements; }

// Device 0: its name, compute capability, multiprocessor count and global memory.
int tfamp_harness_device(char* name, int name_capacity, int* major, int* minor,
                         int* multiprocessors, int64_t* memory_bytes) {
  int count = 0;
  if (Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount")) return -1;
  if (count < 1) return Fail("no CUDA device");
  cudaDeviceProp prop;
  if (Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return -1;
  std::snprintf(name, static_cast<size_t>(name_capacity), "%s", prop.name);
  *major = prop.major;
  *minor = prop.minor;
  *multiprocessors = prop.multiProcessorCount;
  *memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  return 0;
}

// Destroys the device context (what compute-sanitizer's leak check reports at).
int tfamp_harness_reset() { return Check(cudaDeviceReset(), "cudaDeviceReset"); }

void* tfamp_harness_malloc(int64_t bytes) {
  void* pointer = nullptr;
  if (Check(cudaMalloc(&pointer, static_cast<size_t>(bytes)), "cudaMalloc")) return nullptr;
  return pointer;
}

int tfamp_harness_free(void* pointer) { return Check(cudaFree(pointer), "cudaFree"); }

// direction: 1 host to device, 2 device to host, 3 device to device (cudaMemcpyKind).
int tfamp_harness_copy(void* dst, const void* src, int64_t bytes, int direction) {
  return Check(cudaMemcpy(dst, src, static_cast<size_t>(bytes),
                          static_cast<cudaMemcpyKind>(direction)),
               "cudaMemcpy");
}

int tfamp_harness_memset(void* pointer, int value, int64_t bytes) {
  return Check(cudaMemset(pointer, value, static_cast<size_t>(bytes)), "cudaMemset");
}

// The plan the op makes for tensors of these sizes and types (nothing is launched):
// launches, thread blocks over all launches, and the bytes of each launch's table.
int tfamp_harness_plan(const int64_t* sizes, const int32_t* types, int n, int64_t chunk_elements,
                       int max_tensors, int* launches, int64_t* blocks, int* table_bytes) {
  if (CheckPlanArguments(chunk_elements, max_tensors)) return -1;
  if (max_tensors == tfamp::kMostTensorsAllowed) max_tensors = tfamp::MaxTensorsPerLaunch(nullptr);
  std::vector<uint64_t> fake(n, 0);
  const std::vector<tfamp::TensorRef> tensors = Tensors(fake.data(), fake.data(), sizes, types, n);
  if (tfamp::NeedsLargeTables(tensors.data(), n, max_tensors)) {
    DescribePlan<tfamp::LargeLaunchTable>(tensors, chunk_elements, max_tensors, launches, blocks,
                                          table_bytes);
  } else {
    DescribePlan<tfamp::SmallLaunchTable>(tensors, chunk_elements, max_tensors, launches, blocks,
                                          table_bytes);
  }
  return 0;
}

// One call of the op on device buffers `in[i]` -> `out[i]` (may be equal), then waits for the
// device. `inv_scale` and `all_finite` are device pointers; *launches gets the launch count.
int tfamp_harness_unscale(const uint64_t* in, const uint64_t* out, const int64_t* sizes,
                          const int32_t* types, int n, int64_t chunk_elements, int max_tensors,
                          const float* inv_scale, bool* all_finite, int* launches) {
  if (CheckPlanArguments(chunk_elements, max_tensors)) return -1;
  if (PlanAndEnqueue(Tensors(in, out, sizes, types, n), chunk_elements, max_tensors, inv_scale,
                     all_finite, launches)) {
    return -1;
  }
  return Check(cudaDeviceSynchronize(), "the kernel");
}

// Device time per call over `iterations` back-to-back calls (after 3 warm-up calls), measured
// with events; *host_ms: host time per call spent planning and enqueueing.
int tfamp_harness_time_unscale(const uint64_t* in, const uint64_t* out, const int64_t* sizes,
                               const int32_t* types, int n, int64_t chunk_elements,
                               int max_tensors, const float* inv_scale, bool* all_finite,
                               int iterations, float* device_ms, float* host_ms) {
  if (CheckPlanArguments(chunk_elements, max_tensors)) return -1;
  if (iterations < 1) return Fail("iterations must be >= 1");
  const std::vector<tfamp::TensorRef> tensors = Tensors(in, out, sizes, types, n);
  for (int i = 0; i < 3; ++i) {
    if (PlanAndEnqueue(tensors, chunk_elements, max_tensors, inv_scale, all_finite, nullptr)) {
      return -1;
    }
  }
  if (Check(cudaDeviceSynchronize(), "warm-up calls")) return -1;
  cudaEvent_t start, stop;
  if (Check(cudaEventCreate(&start), "cudaEventCreate")) return -1;
  if (Check(cudaEventCreate(&stop), "cudaEventCreate")) return -1;
  int result = Check(cudaEventRecord(start, nullptr), "cudaEventRecord");
  const std::chrono::steady_clock::time_point host_start = std::chrono::steady_clock::now();
  for (int i = 0; result == 0 && i < iterations; ++i) {
    result = PlanAndEnqueue(tensors, chunk_elements, max_tensors, inv_scale, all_finite, nullptr);
  }
  const std::chrono::steady_clock::time_point host_stop = std::chrono::steady_clock::now();
  if (result == 0) result = Check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
  if (result == 0) result = Check(cudaEventSynchronize(stop), "the timed calls");
  float total_ms = 0;
  if (result == 0) result = Check(cudaEventElapsedTime(&total_ms, start, stop), "elapsed time");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  *device_ms = total_ms / iterations;
  *host_ms = std::chrono::duration<float, std::milli>(host_stop - host_start).count() / iterations;
  return result;
}

// Runs `conversion` (enum Conversion) on the n elements at device pointer `in`, writing `out`,
// and waits.
int tfamp_harness_convert(int conversion, const void* in, void* out, int64_t n, float s) {
  if (conversion < 0 || conversion >= kNumConversions) return Fail("unknown conversion");
  if (n < 1) return 0;
  const int64_t threads = 256;
  const int64_t wanted = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 1024 ? wanted : 1024);
  TFAMP_KERNEL_LAUNCH(ConvertKernel, blocks, static_cast<int>(threads), nullptr)(
      conversion, in, out, n, s);
  if (Check(cudaGetLastError(), "launching the conversion probe")) return -1;
  return Check(cudaDeviceSynchronize(), "the conversion probe");
}

// Device time per device-to-device cudaMemcpy of `bytes`, over `iterations` back-to-back
// copies after 3 warm-up copies.
int tfamp_harness_time_copy(void* dst, const void* src, int64_t bytes, int iterations,
                            float* device_ms) {
  if (iterations < 1) return Fail("iterations must be >= 1");
  for (int i = 0; i < 3; ++i) {
    if (tfamp_harness_copy(dst, src, bytes, cudaMemcpyDeviceToDevice)) return -1;
  }
  cudaEvent_t start, stop;
  if (Check(cudaEventCreate(&start), "cudaEventCreate")) return -1;
  if (Check(cudaEventCreate(&stop), "cudaEventCreate")) return -1;
  int result = Check(cudaEventRecord(start, nullptr), "cudaEventRecord");
  for (int i = 0; result == 0 && i < iterations; ++i) {
    result = Check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                                   nullptr),
                   "cudaMemcpyAsync");
  }
  if (result == 0) result = Check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
  if (result == 0) result = Check(cudaEventSynchronize(stop), "the timed copies");
  float total_ms = 0;
  if (result == 0) result = Check(cudaEventElapsedTime(&total_ms, start, stop), "elapsed time");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  *device_ms = total_ms / iterations;
  return result;
}

}  // extern "C"

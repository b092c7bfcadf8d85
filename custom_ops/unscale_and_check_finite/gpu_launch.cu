// CUDA kernel of UnscaleAndCheckFinite: one thread block per chunk of a launch's elements.
//
// The kernel takes its launch's table by value, in one of two sizes (launch_plan.h): 4 KB,
// which every CUDA passes, and 32 KB, which CUDA 12.1 and newer pass to Volta and newer
// GPUs when the driver is 12.1 or newer too. The large one is compiled in only when the
// build can (TFAMP_LARGE_KERNEL_PARAMETERS below) and used only when the driver can and the
// stream is not being captured into a graph (MaxTensorsPerLaunch) and the list needs it
// (NeedsLargeTables). Should a driver refuse the large launch anyway, the call is planned
// again in 4 KB tables, and so is every later one in the process (LargeTablesRefused).
//
// A block walks the slots its chunk overlaps (launch_plan.h: BlockElements,
// ForEachPartOfBlock); small tensors share a block. In each part, when the input and output addresses
// agree modulo 16 bytes, the block unscales with 16-byte loads and stores (kIlp independent
// loads in flight per thread) between a scalar head (up to the first 16-byte boundary) and a
// scalar tail; otherwise element by element. A thread that sees a non-finite input stores
// false into all_finite; the racing stores all write the same value. Plain CUDA: no
// TensorFlow or Eigen headers, so it compiles quickly with any nvcc.
//
// The CPU grid emulation in tests/gpu/emulation/ compiles this file unchanged as C++.
#include <cuda_runtime.h>

#include <atomic>
#include <vector>

#include "gpu_launch.h"
#include "launch_plan.h"
#include "unscale_element.h"

// <<<>>> is spelled through this macro only so that the grid emulation can replace it.
#ifndef TFAMP_KERNEL_LAUNCH
#define TFAMP_KERNEL_LAUNCH(kernel, blocks, threads, stream) kernel<<<blocks, threads, 0, stream>>>
#endif

// Kernel parameters over 4 KB need an nvcc of CUDA 12.1 or newer and Volta or newer for every
// architecture built: the build defines TFAMP_KERNEL_PARAMETERS_4KB_ONLY when it targets an
// older one (tfamp_rewrite/fused_op/cuda_toolchain.py: kernel_parameter_flags).
#if CUDART_VERSION >= 12010 && !defined(TFAMP_KERNEL_PARAMETERS_4KB_ONLY)
#define TFAMP_LARGE_KERNEL_PARAMETERS 1
#endif

namespace tfamp {
namespace {

const int kThreadsPerBlock = 512;
// Two resident blocks per SM: ptxas keeps the kernel within 64 registers per thread.
const int kMinBlocksPerMultiprocessor = 2;
const int kIlp = 4;  // vectors each thread loads before it stores any

// 16 bytes of storage seen as lanes of one element type.
template <ElementType kType>
union Vector16 {
  uint4 raw;
  typename Element<kType>::Bits lanes[16 / sizeof(typename Element<kType>::Bits)];
};

// Unscales the lanes of `v` in place; returns the exponent carries of its input words
// (ExponentCarries: their kLaneTopBits flag the inf and nan lanes). A NaN product leaves the
// conversion as kCanonicalHalfNaN; for bfloat16, TensorFlow's GPU Cast writes
// kEigenBfloat16NaN instead, so those lanes are rewritten, which only a vector holding an inf
// or nan, or a scale that is not finite, can need.
template <ElementType kType>
__device__ __forceinline__ uint32_t UnscaleVector(Vector16<kType>* v, float inv_scale,
                                                  bool scale_is_finite) {
  typedef Element<kType> E;
  const int kLanes = 16 / sizeof(typename E::Bits);
  const uint32_t carries = ExponentCarries<kType>(v->raw.x) | ExponentCarries<kType>(v->raw.y) |
                           ExponentCarries<kType>(v->raw.z) | ExponentCarries<kType>(v->raw.w);
#pragma unroll
  for (int lane = 0; lane < kLanes; ++lane) {
    v->lanes[lane] = E::FromNonNaNFloat(MulRoundedToFloat(E::ToFloat(v->lanes[lane]), inv_scale));
  }
  if (kType == kBFloat16 && !(scale_is_finite && (carries & E::kLaneTopBits) == 0)) {
#pragma unroll
    for (int lane = 0; lane < kLanes; ++lane) {
      if (v->lanes[lane] == kCanonicalHalfNaN) v->lanes[lane] = kEigenBfloat16NaN;
    }
  }
  return carries;
}

// Loads the kIlp vectors a thread handles from `base` (those below num_vec).
template <ElementType kType>
__device__ __forceinline__ void LoadVectors(Vector16<kType> (&v)[kIlp], const uint4* in_vec,
                                            int64_t base, int64_t num_vec) {
#pragma unroll
  for (int k = 0; k < kIlp; ++k) {
    const int64_t i = base + k * kThreadsPerBlock;
    if (i < num_vec) v[k].raw = in_vec[i];
  }
}

// Unscales in[r.begin, r.end) into out[r.begin, r.end) with all threads of the block; returns
// nonzero iff this thread saw an inf or nan.
template <ElementType kType>
__device__ uint32_t UnscalePart(const void* in_ptr, void* out_ptr, ElementRange r,
                                float inv_scale, bool scale_is_finite) {
  typedef typename Element<kType>::Bits Bits;
  typedef Vector16<kType> Vec;
  const int kLanes = 16 / sizeof(Bits);
  const Bits* in = static_cast<const Bits*>(in_ptr) + r.begin;
  Bits* out = static_cast<Bits*>(out_ptr) + r.begin;
  const int64_t n = r.end - r.begin;
  const uintptr_t in_address = reinterpret_cast<uintptr_t>(in);
  // Scalar elements [0, head) and [head + num_vec * kLanes, n); vectors in between.
  int64_t head = n;
  int64_t num_vec = 0;
  if (((in_address ^ reinterpret_cast<uintptr_t>(out)) & 15u) == 0) {
    head = static_cast<int64_t>((16u - (in_address & 15u)) & 15u) / sizeof(Bits);
    head = head < n ? head : n;
    num_vec = (n - head) / kLanes;
  }
  uint32_t nonfinite = 0;
  if (num_vec > 0) {
    const uint4* in_vec = reinterpret_cast<const uint4*>(in + head);
    uint4* out_vec = reinterpret_cast<uint4*>(out + head);
    const int64_t step = kThreadsPerBlock * kIlp;
    uint32_t carries = 0;
    // Loading one round's vectors before unscaling them is best measured: loading the next
    // round's first (prefetching, ILP 2 to fit 64 registers) was 3-15% slower on an H200.
    Vec v[kIlp];
    for (int64_t base = threadIdx.x; base < num_vec; base += step) {
      LoadVectors<kType>(v, in_vec, base, num_vec);
#pragma unroll
      for (int k = 0; k < kIlp; ++k) {
        const int64_t i = base + k * kThreadsPerBlock;
        if (i < num_vec) {
          carries |= UnscaleVector<kType>(&v[k], inv_scale, scale_is_finite);
          out_vec[i] = v[k].raw;
        }
      }
    }
    nonfinite = (carries & Element<kType>::kLaneTopBits) != 0;
  }
  const int64_t vector_elements = num_vec * kLanes;
  for (int64_t j = threadIdx.x; j < n - vector_elements; j += kThreadsPerBlock) {
    const int64_t i = j < head ? j : j + vector_elements;
    out[i] = UnscaleElement<kType>(in[i], inv_scale, &nonfinite);
  }
  return nonfinite;
}

// Unscales the parts of `block` that hold kType elements, from slot `first_slot` (the one
// holding the block's first element). One pass per element type keeps the registers of one
// type's code from being live across the others': nvcc 13 then needs about 50-64 registers
// per thread (sm_75-sm_90, no spills; two 512-thread blocks per SM) where one loop that
// switches on the type needs 74 (one block per SM).
template <ElementType kType, class Table>
__device__ uint32_t UnscaleSlotsOfType(const Table& table, ElementRange block,
                                       int first_slot, float inv_scale, bool scale_is_finite) {
  uint32_t nonfinite = 0;
  ForEachPartOfBlock(table, block, first_slot, [&](int slot, ElementRange part) {
    if (SlotType(table, slot) == kType) {  // uniform across the block: no divergence
      nonfinite |= UnscalePart<kType>(table.in[slot], table.out[slot], part, inv_scale,
                                      scale_is_finite);
    }
  });
  return nonfinite;
}

template <class Table>
__global__ void __launch_bounds__(kThreadsPerBlock, kMinBlocksPerMultiprocessor)
    UnscaleAndCheckFiniteKernel(Table table, const float* inv_scale, bool* all_finite) {
  const ElementRange block = BlockElements(table, blockIdx.x);
  const int first_slot = SlotOfElement(table, block.begin);
  const float s = *inv_scale;
  const bool finite = !Element<kFloat32>::IsNonFinite(FloatBits(s));
  const uint32_t nonfinite = UnscaleSlotsOfType<kFloat32>(table, block, first_slot, s, finite) |
                             UnscaleSlotsOfType<kFloat16>(table, block, first_slot, s, finite) |
                             UnscaleSlotsOfType<kBFloat16>(table, block, first_slot, s, finite);
  if (nonfinite) *all_finite = false;
}

// Plans the list in `Table`s and enqueues all_finite = true, then every launch. When the
// first launch fails and the error is not sticky (the context still works), nothing of the
// list has run: *first_launch_refused (when not null) is then set, so the caller may
// enqueue the list again in another way.
template <class Table>
cudaError_t EnqueuePlan(const TensorRef* tensors, int num_tensors, int64_t chunk_elements,
                        int max_tensors, const float* inv_scale, bool* all_finite,
                        cudaStream_t stream, int* num_launches,
                        bool* first_launch_refused = nullptr) {
  const std::vector<Table> plan =
      PlanLaunches<Table>(tensors, num_tensors, chunk_elements, max_tensors);
  if (num_launches) *num_launches = static_cast<int>(plan.size());
  cudaError_t err = cudaMemsetAsync(all_finite, 1, sizeof(bool), stream);
  for (size_t i = 0; err == cudaSuccess && i < plan.size(); ++i) {
    TFAMP_KERNEL_LAUNCH(UnscaleAndCheckFiniteKernel<Table>, plan[i].num_blocks, kThreadsPerBlock,
                        stream)(plan[i], inv_scale, all_finite);
    err = cudaGetLastError();
    if (err != cudaSuccess && i == 0 && first_launch_refused) {
      *first_launch_refused = cudaPeekAtLastError() == cudaSuccess;
    }
  }
  return err;
}

#if TFAMP_LARGE_KERNEL_PARAMETERS
// Set once a launch with a 32 KB table was refused in this process (a driver that reports
// 12.1 or newer yet refuses, e.g. one behind a virtualisation layer): every later list gets
// 4 KB tables instead of a refused launch per call.
std::atomic<bool> large_tables_refused(false);
#endif

const char* ErrorText(cudaError_t err) {
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

int MaxTensorsPerLaunch(void* stream) {
#if TFAMP_LARGE_KERNEL_PARAMETERS
  // Drivers before 12.1 refuse such a launch. A kernel node over 4 KB in a CUDA graph has
  // crashed cudaGraphAddKernelNode (openxla/xla#19252), so a capturing stream gets 4 KB
  // tables too, as PyTorch's fused optimizers do. Asked on every call: cheap queries, and
  // the stream's state can change between calls.
  int driver = 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusActive;
  if (!large_tables_refused.load(std::memory_order_relaxed) &&
      cudaDriverGetVersion(&driver) == cudaSuccess && driver >= 12010 &&
      cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) == cudaSuccess &&
      capture == cudaStreamCaptureStatusNone) {
    return kLargeTableSlots;
  }
#else
  (void)stream;
#endif
  return kSmallTableSlots;
}

bool LargeTablesRefused() {
#if TFAMP_LARGE_KERNEL_PARAMETERS
  return large_tables_refused.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

const char* EnqueueUnscaleAndCheckFinite(const TensorRef* tensors, int num_tensors,
                                         int64_t chunk_elements, int max_tensors,
                                         const float* inv_scale, bool* all_finite, void* stream,
                                         int* num_launches) {
  if (chunk_elements < 1) return "chunk_elements must be at least 1";
  const int most = MaxTensorsPerLaunch(stream);
  if (max_tensors == kMostTensorsAllowed) max_tensors = most;
  if (max_tensors < 1 || max_tensors > most) {
    return "max_tensors must be kMostTensorsAllowed or lie in [1, MaxTensorsPerLaunch(stream)]";
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#if TFAMP_LARGE_KERNEL_PARAMETERS
  if (NeedsLargeTables(tensors, num_tensors, max_tensors)) {
    bool refused = false;
    const cudaError_t err =
        EnqueuePlan<LargeLaunchTable>(tensors, num_tensors, chunk_elements, max_tensors,
                                      inv_scale, all_finite, s, num_launches, &refused);
    if (!refused) return ErrorText(err);
    large_tables_refused.store(true, std::memory_order_relaxed);
    max_tensors = kSmallTableSlots;
  }
#endif
  return ErrorText(EnqueuePlan<SmallLaunchTable>(tensors, num_tensors, chunk_elements,
                                                 max_tensors, inv_scale, all_finite, s,
                                                 num_launches));
}

}  // namespace tfamp

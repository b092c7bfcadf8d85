// CUDA kernel of UnscaleAndCheckFinite: one thread block per chunk of LaunchTable.
//
// Each block unscales its chunk with 16-byte loads and stores when both buffers are
// 16-byte aligned (ILP independent loads in flight per thread), and element by element
// for the tail or unaligned buffers. A thread that sees a non-finite input stores false
// into all_finite; the racing stores all write the same value. Plain CUDA: no TensorFlow
// or Eigen headers, so it compiles quickly with any nvcc.
#include <cuda_runtime.h>

#include "gpu_launch.h"
#include "launch_plan.h"
#include "unscale_element.h"

namespace tfamp {
namespace {

const int kThreadsPerBlock = 512;
const int kIlp = 4;  // vectors each thread loads before it stores any

__device__ __forceinline__ bool IsAligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// 16 bytes of storage seen as lanes of one element type.
template <ElementType kType>
union Vector16 {
  uint4 raw;
  typename Element<kType>::Bits lanes[16 / sizeof(typename Element<kType>::Bits)];
};

template <ElementType kType>
__device__ uint32_t UnscaleChunk(const void* in_ptr, void* out_ptr, ElementRange r,
                                 float inv_scale) {
  typedef typename Element<kType>::Bits Bits;
  typedef Vector16<kType> Vec;
  const int kLanes = 16 / sizeof(Bits);
  const Bits* in = static_cast<const Bits*>(in_ptr) + r.begin;
  Bits* out = static_cast<Bits*>(out_ptr) + r.begin;
  const int64_t n = r.end - r.begin;
  uint32_t nonfinite = 0;
  int64_t scalar_begin = 0;
  if (IsAligned16(in) && IsAligned16(out)) {
    const uint4* in_vec = reinterpret_cast<const uint4*>(in);
    uint4* out_vec = reinterpret_cast<uint4*>(out);
    const int64_t num_vec = n / kLanes;
    for (int64_t base = threadIdx.x; base < num_vec; base += kThreadsPerBlock * kIlp) {
      Vec v[kIlp];
#pragma unroll
      for (int k = 0; k < kIlp; ++k) {
        const int64_t i = base + k * kThreadsPerBlock;
        if (i < num_vec) v[k].raw = in_vec[i];
      }
#pragma unroll
      for (int k = 0; k < kIlp; ++k) {
        const int64_t i = base + k * kThreadsPerBlock;
        if (i < num_vec) {
#pragma unroll
          for (int lane = 0; lane < kLanes; ++lane) {
            v[k].lanes[lane] = UnscaleElement<kType>(v[k].lanes[lane], inv_scale, &nonfinite);
          }
          out_vec[i] = v[k].raw;
        }
      }
    }
    scalar_begin = num_vec * kLanes;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < n; i += kThreadsPerBlock) {
    out[i] = UnscaleElement<kType>(in[i], inv_scale, &nonfinite);
  }
  return nonfinite;
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    UnscaleAndCheckFiniteKernel(LaunchTable table, const float* inv_scale, bool* all_finite) {
  const int slot = table.block_slot[blockIdx.x];
  const ElementRange r = ChunkElements(table.block_chunk[blockIdx.x], table.chunk_elements,
                                       table.size[slot]);
  const float s = *inv_scale;
  uint32_t nonfinite;
  switch (table.type[slot]) {  // uniform per block: no divergence
    case kFloat16:
      nonfinite = UnscaleChunk<kFloat16>(table.in[slot], table.out[slot], r, s);
      break;
    case kBFloat16:
      nonfinite = UnscaleChunk<kBFloat16>(table.in[slot], table.out[slot], r, s);
      break;
    default:
      nonfinite = UnscaleChunk<kFloat32>(table.in[slot], table.out[slot], r, s);
      break;
  }
  if (nonfinite) *all_finite = false;
}

}  // namespace

const char* EnqueueUnscaleAndCheckFinite(const LaunchTable* plan, int num_launches,
                                         const float* inv_scale, bool* all_finite,
                                         void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(all_finite, 1, sizeof(bool), s);
  for (int i = 0; err == cudaSuccess && i < num_launches; ++i) {
    UnscaleAndCheckFiniteKernel<<<plan[i].num_blocks, kThreadsPerBlock, 0, s>>>(
        plan[i], inv_scale, all_finite);
    err = cudaGetLastError();
  }
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace tfamp

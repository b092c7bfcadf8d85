// CPU kernel of UnscaleAndCheckFinite: one parallel pass over all gradients at once.
//
// The gradient list is cut into kCpuChunkElements-element chunks that span tensors
// (ChunkIndex); Shard spreads the chunks over the intra-op thread pool. Each chunk is a
// branch-free loop (unscale_element.h) that the compiler vectorises; target_clones adds an
// AVX2 version picked at load time, so the library stays portable.
#include <atomic>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

#include "kernel_base.h"
#include "launch_plan.h"
#include "unscale_element.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TFAMP_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TFAMP_CPU_CLONES
#endif

namespace tfamp {
namespace {

// 32K elements: large enough to amortise scheduling, small enough to balance 2..64 threads.
const int64_t kCpuChunkElements = 32768;

template <ElementType kType>
inline uint32_t UnscaleInPlace(typename Element<kType>::Bits* data, int64_t n, float inv_scale) {
  uint32_t nonfinite = 0;
  for (int64_t i = 0; i < n; ++i) data[i] = UnscaleElement<kType>(data[i], inv_scale, &nonfinite);
  return nonfinite;
}

template <ElementType kType>
inline uint32_t UnscaleCopy(const typename Element<kType>::Bits* __restrict__ in,
                            typename Element<kType>::Bits* __restrict__ out, int64_t n,
                            float inv_scale) {
  uint32_t nonfinite = 0;
  for (int64_t i = 0; i < n; ++i) out[i] = UnscaleElement<kType>(in[i], inv_scale, &nonfinite);
  return nonfinite;
}

// One range of one tensor; returns nonzero iff an input element was inf or nan.
// Two loop bodies so that neither needs a runtime aliasing check to vectorise.
template <ElementType kType>
inline uint32_t UnscaleRange(const void* in, void* out, int64_t n, float inv_scale) {
  typedef typename Element<kType>::Bits Bits;
  if (in == out) return UnscaleInPlace<kType>(static_cast<Bits*>(out), n, inv_scale);
  return UnscaleCopy<kType>(static_cast<const Bits*>(in), static_cast<Bits*>(out), n, inv_scale);
}

TFAMP_CPU_CLONES uint32_t UnscaleRangeFloat32(const void* in, void* out, int64_t n, float s) {
  return UnscaleRange<kFloat32>(in, out, n, s);
}
TFAMP_CPU_CLONES uint32_t UnscaleRangeFloat16(const void* in, void* out, int64_t n, float s) {
  return UnscaleRange<kFloat16>(in, out, n, s);
}
TFAMP_CPU_CLONES uint32_t UnscaleRangeBFloat16(const void* in, void* out, int64_t n, float s) {
  return UnscaleRange<kBFloat16>(in, out, n, s);
}

uint32_t UnscaleChunk(const TensorRef& t, ElementRange r, float inv_scale) {
  typedef uint32_t (*RangeFn)(const void*, void*, int64_t, float);
  static const RangeFn kByType[] = {UnscaleRangeFloat32, UnscaleRangeFloat16,
                                    UnscaleRangeBFloat16};
  const int64_t bytes = t.type == kFloat32 ? 4 : 2;
  const char* in = static_cast<const char*>(t.in) + r.begin * bytes;
  char* out = static_cast<char*>(t.out) + r.begin * bytes;
  return kByType[t.type](in, out, r.end - r.begin, inv_scale);
}

class UnscaleAndCheckFiniteCpuOp : public UnscaleAndCheckFiniteKernel {
 public:
  explicit UnscaleAndCheckFiniteCpuOp(tensorflow::OpKernelConstruction* ctx)
      : UnscaleAndCheckFiniteKernel(ctx) {}

 protected:
  void Unscale(tensorflow::OpKernelContext* ctx, const std::vector<TensorRef>& tensors,
               const tensorflow::Tensor& inv_scale_tensor, tensorflow::Tensor* all_finite) override {
    const float inv_scale = inv_scale_tensor.scalar<float>()();
    const ChunkIndex chunks(tensors.data(), static_cast<int>(tensors.size()), kCpuChunkElements);
    std::atomic<uint32_t> nonfinite(0);
    auto work = [&](int64_t first, int64_t last) {
      uint32_t local = 0;
      for (int64_t c = first; c < last; ++c) {
        int tensor;
        int64_t chunk;
        chunks.Locate(c, &tensor, &chunk);
        const TensorRef& t = tensors[tensor];
        local |= UnscaleChunk(t, ChunkElements(chunk, kCpuChunkElements, t.size), inv_scale);
      }
      if (local != 0) nonfinite.store(1, std::memory_order_relaxed);
    };
    const tensorflow::DeviceBase::CpuWorkerThreads& workers =
        *ctx->device()->tensorflow_cpu_worker_threads();
    // Cost per chunk in the sharder's units (~cycles): a few per element.
    tensorflow::Shard(workers.num_threads, workers.workers, chunks.num_chunks(),
                      4 * kCpuChunkElements, work);
    all_finite->scalar<bool>()() = nonfinite.load(std::memory_order_relaxed) == 0;
  }
};

}  // namespace
}  // namespace tfamp

REGISTER_KERNEL_BUILDER(Name("UnscaleAndCheckFinite").Device(tensorflow::DEVICE_CPU),
                        tfamp::UnscaleAndCheckFiniteCpuOp);

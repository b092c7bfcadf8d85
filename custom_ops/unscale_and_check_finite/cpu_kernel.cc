// CPU kernel of UnscaleAndCheckFinite: one parallel pass over all gradients at once.
//
// The gradient list is cut into kCpuChunkElements-element chunks that span tensors
// (ChunkIndex); Shard spreads the chunks over the intra-op thread pool. Each chunk runs
// the loop of the instruction set cpu_isa.h selects when the kernel is built: explicit
// AVX-512 or AVX2 (+F16C) code (cpu_simd.h), or the portable branch-free loop over
// unscale_element.h. TfampUnscaleCpuIsa() tells which path a kernel built now would take.
#include <atomic>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

#include "cpu_isa.h"
#include "cpu_simd.h"
#include "kernel_base.h"
#include "launch_plan.h"
#include "unscale_element.h"

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

// The portable loop over one range of one tensor; nonzero iff an input was inf or nan.
// Two loop bodies so that neither needs a runtime aliasing check to vectorise.
template <ElementType kType>
uint32_t UnscaleScalar(const void* in, void* out, int64_t n, float inv_scale) {
  typedef typename Element<kType>::Bits Bits;
  if (in == out) return UnscaleInPlace<kType>(static_cast<Bits*>(out), n, inv_scale);
  return UnscaleCopy<kType>(static_cast<const Bits*>(in), static_cast<Bits*>(out), n, inv_scale);
}

typedef uint32_t (*RangeFn)(const void* in, void* out, int64_t n, float inv_scale);

// kRangeFns[isa][element type]
const RangeFn kRangeFns[3][3] = {
    {UnscaleScalar<kFloat32>, UnscaleScalar<kFloat16>, UnscaleScalar<kBFloat16>},
#if defined(TFAMP_HAVE_X86_SIMD)
    {UnscaleFloat32Avx2, UnscaleFloat16Avx2, UnscaleBFloat16Avx2},
    {UnscaleFloat32Avx512, UnscaleFloat16Avx512, UnscaleBFloat16Avx512},
#else
    {UnscaleScalar<kFloat32>, UnscaleScalar<kFloat16>, UnscaleScalar<kBFloat16>},
    {UnscaleScalar<kFloat32>, UnscaleScalar<kFloat16>, UnscaleScalar<kBFloat16>},
#endif
};

uint32_t UnscaleChunk(const RangeFn* by_type, const TensorRef& t, ElementRange r, float inv_scale) {
  const int64_t bytes = t.type == kFloat32 ? 4 : 2;
  const char* in = static_cast<const char*>(t.in) + r.begin * bytes;
  char* out = static_cast<char*>(t.out) + r.begin * bytes;
  return by_type[t.type](in, out, r.end - r.begin, inv_scale);
}

class UnscaleAndCheckFiniteCpuOp : public UnscaleAndCheckFiniteKernel {
 public:
  explicit UnscaleAndCheckFiniteCpuOp(tensorflow::OpKernelConstruction* ctx)
      : UnscaleAndCheckFiniteKernel(ctx), range_fns_(kRangeFns[SelectedCpuIsa()]) {}

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
        local |= UnscaleChunk(range_fns_, t, ChunkElements(chunk, kCpuChunkElements, t.size),
                              inv_scale);
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

 private:
  const RangeFn* range_fns_;  // by element type, for the instruction set chosen at construction
};

}  // namespace
}  // namespace tfamp

REGISTER_KERNEL_BUILDER(Name("UnscaleAndCheckFinite").Device(tensorflow::DEVICE_CPU),
                        tfamp::UnscaleAndCheckFiniteCpuOp);

// The instruction set a CPU kernel constructed now would use ("scalar", "avx2", "avx512"),
// for tools and benchmarks to report (call through ctypes on the loaded library).
extern "C" __attribute__((visibility("default"))) const char* TfampUnscaleCpuIsa() {
  return tfamp::CpuIsaName(tfamp::SelectedCpuIsa());
}

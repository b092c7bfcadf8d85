// CPU kernel of RoundToHalf: one pass over the tensor, in place when TensorFlow allows.
//
// Shard spreads ranges of elements over the intra-op thread pool; each range runs the loop
// of the instruction set cpu_isa.h selects when the kernel is constructed (explicit AVX-512
// or AVX2 + F16C code from round_simd.h, or the portable loop over round_element.h). All
// paths return the same bits. The library's TfampUnscaleCpuIsa() says which path a kernel
// constructed now takes (the same selection as UnscaleAndCheckFinite's).
#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/work_sharder.h"

#include "../unscale_and_check_finite/cpu_isa.h"
#include "round_element.h"
#include "round_simd.h"

namespace tfamp {
namespace {

// The sharder's cost of one element (~cycles): a load, a few integer or F16C instructions
// and a store. Tensors under ~5000 elements run on the calling thread.
const int64_t kCostPerElement = 2;

typedef void (*RoundFn)(const uint32_t* in, uint32_t* out, int64_t n);

template <ElementType kType>
inline void RoundInPlace(uint32_t* data, int64_t n) {
  for (int64_t i = 0; i < n; ++i) data[i] = RoundElement<kType>(data[i]);
}

template <ElementType kType>
inline void RoundCopy(const uint32_t* __restrict__ in, uint32_t* __restrict__ out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = RoundElement<kType>(in[i]);
}

// The portable loop. Two bodies, so that neither needs a run-time aliasing check to
// vectorise (in place, that check would fall back to one element at a time).
template <ElementType kType>
void RoundScalar(const uint32_t* in, uint32_t* out, int64_t n) {
  if (in == out) {
    RoundInPlace<kType>(out, n);
  } else {
    RoundCopy<kType>(in, out, n);
  }
}

// kRoundFns[isa][0: float16, 1: bfloat16]
const RoundFn kRoundFns[3][2] = {
    {RoundScalar<kFloat16>, RoundScalar<kBFloat16>},
#if defined(TFAMP_HAVE_X86_SIMD)
    {RoundFloat16Avx2, RoundBFloat16Avx2},
    {RoundFloat16Avx512, RoundBFloat16Avx512},
#else
    {RoundScalar<kFloat16>, RoundScalar<kBFloat16>},
    {RoundScalar<kFloat16>, RoundScalar<kBFloat16>},
#endif
};

class RoundToHalfCpuOp : public tensorflow::OpKernel {
 public:
  explicit RoundToHalfCpuOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    tensorflow::DataType half_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("half_type", &half_type));
    round_ = kRoundFns[SelectedCpuIsa()][half_type == tensorflow::DT_BFLOAT16 ? 1 : 0];
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& input = ctx->input(0);
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, input.shape(), &output));
    const uint32_t* in = reinterpret_cast<const uint32_t*>(input.flat<float>().data());
    uint32_t* out = reinterpret_cast<uint32_t*>(output->flat<float>().data());
    const RoundFn round_range = round_;
    auto work = [in, out, round_range](int64_t begin, int64_t end) {
      round_range(in + begin, out + begin, end - begin);
    };
    const tensorflow::DeviceBase::CpuWorkerThreads& workers =
        *ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(workers.num_threads, workers.workers, input.NumElements(), kCostPerElement,
                      work);
  }

 private:
  RoundFn round_ = nullptr;  // for the half type and the instruction set chosen at construction
};

}  // namespace
}  // namespace tfamp

REGISTER_KERNEL_BUILDER(Name("RoundToHalf").Device(tensorflow::DEVICE_CPU),
                        tfamp::RoundToHalfCpuOp);

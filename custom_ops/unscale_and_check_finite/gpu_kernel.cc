// GPU kernel of UnscaleAndCheckFinite: plans the launches on the host and enqueues them on
// the op's stream (gpu_launch.cu), as few as this process's CUDA allows. inv_scale and
// all_finite stay in device memory, so the op never waits for the device.
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

#include "gpu_launch.h"
#include "kernel_base.h"
#include "launch_plan.h"
#include "tf_compat.h"

namespace tfamp {
namespace {

class UnscaleAndCheckFiniteGpuOp : public UnscaleAndCheckFiniteKernel {
 public:
  explicit UnscaleAndCheckFiniteGpuOp(tensorflow::OpKernelConstruction* ctx)
      : UnscaleAndCheckFiniteKernel(ctx) {}

 protected:
  void Unscale(tensorflow::OpKernelContext* ctx, const std::vector<TensorRef>& tensors,
               const tensorflow::Tensor& inv_scale, tensorflow::Tensor* all_finite) override {
    void* stream = GpuStreamOf(ctx);
    const char* error = EnqueueUnscaleAndCheckFinite(
        tensors.data(), static_cast<int>(tensors.size()), kGpuChunkElements,
        MaxTensorsPerLaunch(stream), reinterpret_cast<const float*>(DataOf(inv_scale)),
        reinterpret_cast<bool*>(DataOf(*all_finite)), stream, nullptr);
    OP_REQUIRES(ctx, error == nullptr,
                tensorflow::errors::Internal("UnscaleAndCheckFinite: CUDA launch failed: ",
                                             error ? error : ""));
  }
};

}  // namespace
}  // namespace tfamp

REGISTER_KERNEL_BUILDER(Name("UnscaleAndCheckFinite").Device(tensorflow::DEVICE_GPU),
                        tfamp::UnscaleAndCheckFiniteGpuOp);

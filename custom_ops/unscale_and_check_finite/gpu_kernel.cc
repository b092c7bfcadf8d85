// GPU kernel of UnscaleAndCheckFinite: plans the launches on the host and enqueues them on
// the op's stream (gpu_launch.cu), as few as this process's CUDA allows. inv_scale and
// all_finite stay in device memory, so the op never waits for the device.
#include <atomic>
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
    const char* error = EnqueueUnscaleAndCheckFinite(
        tensors.data(), static_cast<int>(tensors.size()), kGpuChunkElements,
        kMostTensorsAllowed, reinterpret_cast<const float*>(DataOf(inv_scale)),
        reinterpret_cast<bool*>(DataOf(*all_finite)), GpuStreamOf(ctx), nullptr);
    OP_REQUIRES(ctx, error == nullptr,
                tensorflow::errors::Internal("UnscaleAndCheckFinite: CUDA launch failed: ",
                                             error ? error : ""));
    SayOnceIfLargeTablesRefused();
  }

 private:
  // The fallback changes only the speed (one launch per kSmallTableSlots gradients), but the
  // user should know why a long list takes several launches.
  static void SayOnceIfLargeTablesRefused() {
    static std::atomic<bool> said(false);
    if (LargeTablesRefused() && !said.exchange(true)) {
      LOG(WARNING) << "UnscaleAndCheckFinite: this CUDA driver refused a kernel launch with "
                   << "32 KB of parameters although it reports CUDA 12.1 or newer; the op "
                   << "uses 4 KB launch tables (one launch per " << kSmallTableSlots
                   << " gradients) for the rest of this process.";
    }
  }
};

}  // namespace
}  // namespace tfamp

REGISTER_KERNEL_BUILDER(Name("UnscaleAndCheckFinite").Device(tensorflow::DEVICE_GPU),
                        tfamp::UnscaleAndCheckFiniteGpuOp);

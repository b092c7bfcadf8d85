// What the CPU and CUDA kernels of UnscaleAndCheckFinite share: checking the inputs and
// giving every gradient an output buffer, before the device-specific pass.
#ifndef TFAMP_KERNEL_BASE_H_
#define TFAMP_KERNEL_BASE_H_

#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

#include "launch_plan.h"

namespace tfamp {

inline ElementType ElementTypeOf(tensorflow::DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_HALF:
      return kFloat16;
    case tensorflow::DT_BFLOAT16:
      return kBFloat16;
    default:  // the op's type attribute admits only half, float and bfloat16
      return kFloat32;
  }
}

inline char* DataOf(const tensorflow::Tensor& t) {
  return const_cast<char*>(t.tensor_data().data());
}

// Checks `inv_scale`, then gives every gradient an output: its own buffer when TensorFlow
// allows reuse (exclusively owned input), a new one otherwise. On success `tensors` holds
// one TensorRef per gradient, `inv_scale` the scalar input, `all_finite` the flag output.
inline tensorflow::Status PrepareUnscaleIo(tensorflow::OpKernelContext* ctx,
                                           std::vector<TensorRef>* tensors,
                                           const tensorflow::Tensor** inv_scale,
                                           tensorflow::Tensor** all_finite) {
  const int num_grads = ctx->num_inputs() - 1;
  *inv_scale = &ctx->input(num_grads);
  if (!tensorflow::TensorShapeUtils::IsScalar((*inv_scale)->shape())) {
    return tensorflow::errors::InvalidArgument(
        "UnscaleAndCheckFinite: inv_scale must be a scalar (1 / loss scale), got shape ",
        (*inv_scale)->shape().DebugString(), "; reshape it to [] before the call.");
  }
  tensors->clear();
  tensors->reserve(num_grads);
  for (int i = 0; i < num_grads; ++i) {
    const tensorflow::Tensor& grad = ctx->input(i);
    tensorflow::Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->forward_input_or_allocate_output({i}, i, grad.shape(), &out));
    TensorRef ref;
    ref.in = DataOf(grad);
    ref.out = DataOf(*out);
    ref.size = grad.NumElements();
    ref.type = ElementTypeOf(grad.dtype());
    tensors->push_back(ref);
  }
  return ctx->allocate_output(num_grads, tensorflow::TensorShape({}), all_finite);
}

// Prepares inputs and outputs, then hands them to the device's Unscale.
class UnscaleAndCheckFiniteKernel : public tensorflow::OpKernel {
 public:
  explicit UnscaleAndCheckFiniteKernel(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    std::vector<TensorRef> tensors;
    const tensorflow::Tensor* inv_scale = nullptr;
    tensorflow::Tensor* all_finite = nullptr;
    OP_REQUIRES_OK(ctx, PrepareUnscaleIo(ctx, &tensors, &inv_scale, &all_finite));
    Unscale(ctx, tensors, *inv_scale, all_finite);
  }

 protected:
  // Writes every tensors[i].out and the scalar bool *all_finite (both on the op's device).
  virtual void Unscale(tensorflow::OpKernelContext* ctx, const std::vector<TensorRef>& tensors,
                       const tensorflow::Tensor& inv_scale, tensorflow::Tensor* all_finite) = 0;
};

}  // namespace tfamp

#endif  // TFAMP_KERNEL_BASE_H_

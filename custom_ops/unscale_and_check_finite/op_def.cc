// Registration of the UnscaleAndCheckFinite op (kernels live in cpu_kernel.cc / gpu_kernel.cc).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfamp {
namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// Each unscaled output has its gradient's shape; all_finite is a scalar; inv_scale must be one.
tensorflow::Status UnscaleAndCheckFiniteShape(InferenceContext* c) {
  const int num_grads = c->num_inputs() - 1;
  ShapeHandle scalar;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(num_grads), 0, &scalar));
  for (int i = 0; i < num_grads; ++i) c->set_output(i, c->input(i));
  c->set_output(num_grads, c->Scalar());
  return tensorflow::Status();
}

}  // namespace
}  // namespace tfamp

REGISTER_OP("UnscaleAndCheckFinite")
    .Input("grads: T")
    .Input("inv_scale: float")
    .Output("unscaled: T")
    .Output("all_finite: bool")
    .Attr("T: list({half, float, bfloat16}) >= 1")
    .SetShapeFn(tfamp::UnscaleAndCheckFiniteShape)
    .Doc(R"doc(
Unscales loss-scaled gradients and checks them for inf/nan in one pass.

unscaled[i] = grads[i] * inv_scale, computed in float32 and rounded to grads[i]'s type;
inf and nan propagate. Outputs reuse the gradient buffers when TensorFlow allows.

grads: the gradients (half, float or bfloat16; types may differ).
inv_scale: scalar, the reciprocal of the loss scale.
unscaled: the unscaled gradients, same shapes and types as grads.
all_finite: true iff every element of every input gradient is finite.
)doc");

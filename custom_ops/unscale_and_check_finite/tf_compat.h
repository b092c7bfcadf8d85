// The few TensorFlow calls whose spelling differs between TF 1.15 and TF 2.x.
// Everything else in this op uses names present in both.
#ifndef TFAMP_TF_COMPAT_H_
#define TFAMP_TF_COMPAT_H_

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/stream_executor.h"

// TFAMP_TF_MAJOR / TFAMP_TF_MINOR come from the build (tfamp_rewrite/fused_op_build.py).
#ifndef TFAMP_TF_MAJOR
#error "build with -DTFAMP_TF_MAJOR=<major> -DTFAMP_TF_MINOR=<minor> (make op does)"
#endif

namespace tfamp {

// The cudaStream_t of the op's device context, as void* so no CUDA header is needed here.
inline void* GpuStreamOf(tensorflow::OpKernelContext* ctx) {
  stream_executor::Stream* stream = ctx->op_device_context()->stream();
#if TFAMP_TF_MAJOR > 2 || (TFAMP_TF_MAJOR == 2 && TFAMP_TF_MINOR >= 15)
  return stream->platform_specific_handle().stream;
#else
  return *stream->implementation()->GpuStreamMemberHack();
#endif
}

}  // namespace tfamp

#endif  // TFAMP_TF_COMPAT_H_

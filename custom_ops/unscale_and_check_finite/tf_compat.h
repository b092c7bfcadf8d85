// The few TensorFlow calls whose spelling differs between TF 1.15 and TF 2.x.
// Everything else in this op uses names present in both.
#ifndef TFAMP_TF_COMPAT_H_
#define TFAMP_TF_COMPAT_H_

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/stream_executor.h"
#include "tensorflow/core/public/version.h"

namespace tfamp {

// The cudaStream_t of the op's device context, as void* so no CUDA header is needed here.
inline void* GpuStreamOf(tensorflow::OpKernelContext* ctx) {
  stream_executor::Stream* stream = ctx->op_device_context()->stream();
#if TF_MAJOR_VERSION > 2 || (TF_MAJOR_VERSION == 2 && TF_MINOR_VERSION >= 15)
  return stream->platform_specific_handle().stream;
#else
  return *stream->implementation()->GpuStreamMemberHack();
#endif
}

}  // namespace tfamp

#endif  // TFAMP_TF_COMPAT_H_

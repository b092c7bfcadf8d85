// Host entry point of the CUDA kernel (gpu_launch.cu), callable from code that includes
// no CUDA header. Plain C++11.
#ifndef TFAMP_GPU_LAUNCH_H_
#define TFAMP_GPU_LAUNCH_H_

#include "launch_plan.h"

namespace tfamp {

// Enqueues on `stream` (a cudaStream_t): all_finite = true, then every launch of `plan`.
// `inv_scale` and `all_finite` are device pointers; nothing waits for the device.
// Returns nullptr on success, else CUDA's description of the launch error.
const char* EnqueueUnscaleAndCheckFinite(const LaunchTable* plan, int num_launches,
                                         const float* inv_scale, bool* all_finite,
                                         void* stream);

}  // namespace tfamp

#endif  // TFAMP_GPU_LAUNCH_H_

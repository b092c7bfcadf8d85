// Host entry points of the CUDA kernel (gpu_launch.cu), callable from code that includes
// no CUDA header. Plain C++11.
#ifndef TFAMP_GPU_LAUNCH_H_
#define TFAMP_GPU_LAUNCH_H_

#include <cstdint>

#include "launch_plan.h"

namespace tfamp {

// The most slots one launch on `stream` (a cudaStream_t) takes: kLargeTableSlots when the
// nvcc that built gpu_launch.cu and the installed driver both pass kernel parameters over
// 4 KB (CUDA 12.1 or newer), the build targets only Volta and newer, and the stream is not
// being captured into a CUDA graph, and no such launch was refused in this process
// (LargeTablesRefused); else kSmallTableSlots.
int MaxTensorsPerLaunch(void* stream);

// Whether a launch with a 32 KB table has been refused in this process (although the
// driver reported 12.1 or newer): from then on every list is planned in 4 KB tables.
bool LargeTablesRefused();

// EnqueueUnscaleAndCheckFinite's max_tensors for "as many as MaxTensorsPerLaunch allows".
const int kMostTensorsAllowed = 0;

// Plans `tensors` into launches of at most `max_tensors` slots (kMostTensorsAllowed, or 1 <=
// max_tensors <= MaxTensorsPerLaunch(stream)) and `chunk_elements`-element blocks
// (launch_plan.h: PlanLaunches), in 4 KB tables when one holds them (NeedsLargeTables), else
// in 32 KB ones; then enqueues on `stream` (a cudaStream_t): all_finite = true, then every
// launch. When the first 32 KB launch is refused, the list is planned again in 4 KB tables
// (at most kSmallTableSlots slots each) and enqueued. `inv_scale` and `all_finite` are
// device pointers; nothing waits for the device. *num_launches (when not null) gets the
// number of launches. Returns nullptr on success, else what went wrong (CUDA's description
// of a launch error, or the argument out of range).
const char* EnqueueUnscaleAndCheckFinite(const TensorRef* tensors, int num_tensors,
                                         int64_t chunk_elements, int max_tensors,
                                         const float* inv_scale, bool* all_finite, void* stream,
                                         int* num_launches);

}  // namespace tfamp

#endif  // TFAMP_GPU_LAUNCH_H_

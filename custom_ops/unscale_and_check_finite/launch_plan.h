// How the gradient list is cut into work: fixed-size chunks of elements that span tensors.
//
// Both kernels see the list as one sequence of chunks, tensor after tensor:
//   * the CPU kernel shards the global chunk index range over its thread pool
//     (ChunkIndex maps a global chunk back to its tensor);
//   * the CUDA kernel runs one thread block per chunk; PlanLaunches packs the chunks into
//     as few launches as the fixed-size kernel argument (LaunchTable) allows, splitting a
//     tensor across launches when a table fills up in the middle of it.
// Plain C++11, no TensorFlow or CUDA headers: the planner is unit-tested on the CPU.
#ifndef TFAMP_LAUNCH_PLAN_H_
#define TFAMP_LAUNCH_PLAN_H_

#include <cstdint>
#include <vector>

#include "unscale_element.h"

namespace tfamp {

// One gradient: where to read, where to write (may equal `in`), how many elements, type.
struct TensorRef {
  const void* in;
  void* out;
  int64_t size;
  ElementType type;
};

// Elements in [begin, end) of one tensor.
struct ElementRange {
  int64_t begin;
  int64_t end;
};

TFAMP_HOST_DEVICE ElementRange ChunkElements(int64_t chunk, int64_t chunk_elements,
                                             int64_t tensor_size) {
  ElementRange r;
  r.begin = chunk * chunk_elements;
  r.end = r.begin + chunk_elements < tensor_size ? r.begin + chunk_elements : tensor_size;
  return r;
}

// Global chunk numbering over a tensor list (the CPU kernel's work items).
class ChunkIndex {
 public:
  ChunkIndex(const TensorRef* tensors, int num_tensors, int64_t chunk_elements);

  int64_t num_chunks() const { return first_chunk_.back(); }
  int64_t chunk_elements() const { return chunk_elements_; }

  // The tensor holding global chunk `chunk`, and the chunk's index inside that tensor.
  void Locate(int64_t chunk, int* tensor, int64_t* chunk_in_tensor) const;

 private:
  int64_t chunk_elements_;
  std::vector<int64_t> first_chunk_;  // first_chunk_[i]: global index of tensor i's chunk 0
};

// Capacity of one CUDA launch. The table is the kernel's by-value argument, which must
// stay within 4 KB: the parameter limit of every CUDA before 12.1 (TF 1.15 users' nvcc).
const int kMaxTensorsPerLaunch = 96;
const int kMaxBlocksPerLaunch = 320;
const int64_t kGpuChunkElements = 65536;

// Everything one launch of the CUDA kernel needs: a tensor table and, per thread block,
// which tensor (slot in the table) and which chunk of it the block processes.
struct LaunchTable {
  const void* in[kMaxTensorsPerLaunch];
  void* out[kMaxTensorsPerLaunch];
  int64_t size[kMaxTensorsPerLaunch];
  int64_t chunk_elements;
  int32_t block_chunk[kMaxBlocksPerLaunch];
  uint8_t block_slot[kMaxBlocksPerLaunch];
  uint8_t type[kMaxTensorsPerLaunch];
  int32_t num_tensors;
  int32_t num_blocks;
};

// Kernel parameters are the table plus two pointers (inv_scale, all_finite).
static_assert(sizeof(LaunchTable) + 2 * sizeof(void*) <= 4096,
              "LaunchTable must fit the 4 KB CUDA kernel parameter limit");
static_assert(kMaxTensorsPerLaunch <= 256, "block_slot is a uint8_t");

// Packs every chunk of every non-empty tensor into launches, in order. A launch is closed
// only when its block table is full or a new tensor needs a slot and none is left, so a
// model needs about max(total_chunks / max_blocks, tensors / max_tensors) launches.
// `max_tensors` / `max_blocks` may be lowered below the table capacity (tests do).
std::vector<LaunchTable> PlanLaunches(const TensorRef* tensors, int num_tensors,
                                      int64_t chunk_elements = kGpuChunkElements,
                                      int max_tensors = kMaxTensorsPerLaunch,
                                      int max_blocks = kMaxBlocksPerLaunch);

}  // namespace tfamp

#endif  // TFAMP_LAUNCH_PLAN_H_

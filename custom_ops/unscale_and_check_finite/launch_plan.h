// How the gradient list is cut into work for the two kernels.
//
//   * The CPU kernel shards fixed-size chunks of each tensor over its thread pool
//     (ChunkIndex numbers them globally and maps a chunk back to its tensor).
//   * The CUDA kernel sees each launch's tensors as one sequence of elements, tensor after
//     tensor, and runs one thread block per chunk_elements of that sequence: a block may
//     span the end of one tensor and the start of the next (small tensors share a block),
//     so only the last block of a launch is partly idle. PlanLaunches fills as few launches
//     as the fixed-size kernel argument (LaunchTable) allows: one per table's capacity of
//     tensors, whatever their sizes.
// Plain C++11, no TensorFlow or CUDA headers: the planner is unit-tested on the CPU, and the
// block-to-tensor mapping below is the very code the CUDA kernel runs.
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

// Capacity of one CUDA launch: as many slots (tensors, or pieces of a tensor too big for one
// launch) as fit the kernel's by-value argument, a LaunchTable. Two sizes:
//   * SmallLaunchTable, 203 slots of 20 bytes within the 4 KB parameter limit of every CUDA
//     before 12.1 (TF 1.15 users' nvcc): ResNet-50 (161 tensors) and BERT-base (199) take
//     one launch;
//   * LargeLaunchTable, 1636 slots within the 32,764 bytes that CUDA 12.1 and newer pass to
//     Volta and newer GPUs, when the driver is 12.1 or newer too (gpu_launch.cu decides):
//     a 1000-tensor transformer in one launch instead of five.
// Each launch boundary costs 6-8 us on an H200 (tests/gpu/gpu_check.py's tensors-per-launch
// sweep).
const int kSmallTableSlots = 203;
const int kLargeTableSlots = 1636;
// A slot's first element is stored in 30 bits, its element type in the top 2: a launch holds
// fewer than 2^30 elements, and a bigger tensor is cut into pieces, one slot each.
const int kSlotTypeShift = 30;
const uint32_t kSlotStartMask = (1u << kSlotTypeShift) - 1u;
const int64_t kMaxElementsPerLaunch = kSlotStartMask;

// Elements per thread block: 2-4 rounds of the kernel's 16-byte x ILP loop (float32 to
// 16-bit types), and still several waves on a large GPU (ResNet-50: 781 blocks against 264
// resident on an H100 or H200 at two blocks per SM). Measured on an H200 (tests/gpu/
// gpu_check.py sweeps it): within 1-3% of 16384 (ahead on 16-bit lists, behind on float32),
// 10-18% ahead of it before the kernel converted with the GPU's instructions. Tried and
// slower by 5-20%: one wave per launch, each of the resident blocks given an equal share
// (chunk = elements / resident blocks); a launch boundary still cost about 6 us.
const int64_t kGpuChunkElements = 32768;

// Everything one launch of the CUDA kernel needs, for up to kSlots slots. Slot s holds the
// launch's elements [SlotStart(s), SlotStart(s + 1)) of type SlotType(s), read from in[s] and
// written to out[s]; block b processes the launch's elements
// [b * chunk_elements, (b + 1) * chunk_elements), whichever slots they fall in.
template <int kSlots>
struct LaunchTable {
  static const int kCapacity = kSlots;
  const void* in[kSlots];
  void* out[kSlots];
  // Slot s: its first element (low 30 bits) | its ElementType << kSlotTypeShift;
  // slot_start[num_tensors]: the launch's element count.
  uint32_t slot_start[kSlots + 1];
  int64_t chunk_elements;
  int32_t num_tensors;  // slots in use
  int32_t num_blocks;   // ceil(elements / chunk_elements)
};

typedef LaunchTable<kSmallTableSlots> SmallLaunchTable;
typedef LaunchTable<kLargeTableSlots> LargeLaunchTable;

// Kernel parameters are the table plus two pointers (inv_scale, all_finite).
static_assert(sizeof(SmallLaunchTable) + 2 * sizeof(void*) <= 4096,
              "SmallLaunchTable must fit the 4 KB CUDA kernel parameter limit");
static_assert(sizeof(LargeLaunchTable) + 2 * sizeof(void*) <= 32764,
              "LargeLaunchTable must fit the 32,764-byte limit of CUDA 12.1 and newer");

template <class Table>
TFAMP_HOST_DEVICE int64_t SlotStart(const Table& table, int slot) {
  return static_cast<int64_t>(table.slot_start[slot] & kSlotStartMask);
}

template <class Table>
TFAMP_HOST_DEVICE ElementType SlotType(const Table& table, int slot) {
  return static_cast<ElementType>(table.slot_start[slot] >> kSlotTypeShift);
}

template <class Table>
TFAMP_HOST_DEVICE int64_t LaunchElements(const Table& table) {
  return SlotStart(table, table.num_tensors);
}

// The launch's elements [begin, end) that block `block` processes.
template <class Table>
TFAMP_HOST_DEVICE ElementRange BlockElements(const Table& table, int64_t block) {
  return ChunkElements(block, table.chunk_elements, LaunchElements(table));
}

// The slot holding the launch's element `element` (< LaunchElements): binary search, since
// SlotStart strictly increases (slots are never empty).
template <class Table>
TFAMP_HOST_DEVICE int SlotOfElement(const Table& table, int64_t element) {
  int lo = 0;
  int hi = table.num_tensors - 1;
  while (lo < hi) {  // invariant: SlotStart(lo) <= element < SlotStart(hi + 1)
    const int mid = (lo + hi + 1) / 2;
    if (SlotStart(table, mid) <= element) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The elements of slot `slot`'s tensor that fall in the launch's range `block` (may be
// empty, begin >= end, when the slot lies outside it).
template <class Table>
TFAMP_HOST_DEVICE ElementRange SlotPart(const Table& table, int slot, ElementRange block) {
  const int64_t first = SlotStart(table, slot);
  const int64_t last = SlotStart(table, slot + 1);
  ElementRange r;
  r.begin = (block.begin > first ? block.begin : first) - first;
  r.end = (block.end < last ? block.end : last) - first;
  return r;
}

// What block `block` of a launch does: visit(slot, part) for every slot its elements overlap,
// in slot order, `part` being the slot tensor's elements in the block (never empty):
//   for slot = SlotOfElement(block.begin); slot's first element < block.end; ++slot
// `first_slot` must be SlotOfElement(table, block.begin) (a caller that walks the block more
// than once finds it once).
template <class Table, typename Visit>
TFAMP_HOST_DEVICE void ForEachPartOfBlock(const Table& table, ElementRange block,
                                          int first_slot, Visit visit) {
  for (int slot = first_slot; slot < table.num_tensors && SlotStart(table, slot) < block.end;
       ++slot) {
    visit(slot, SlotPart(table, slot, block));
  }
}

template <class Table, typename Visit>
TFAMP_HOST_DEVICE void ForEachPartOfBlock(const Table& table, ElementRange block,
                                          Visit visit) {
  ForEachPartOfBlock(table, block, SlotOfElement(table, block.begin), visit);
}

// Packs every non-empty tensor, in order, into launches of at most `max_tensors` slots
// (<= Table::kCapacity) and kMaxElementsPerLaunch elements (a launch is closed only when
// full), and `chunk_elements`-element blocks:
//   for each tensor t with size > 0, while elements of t remain:
//     if the current table is full (max_tensors slots or kMaxElementsPerLaunch elements):
//       close it, open a new one
//     slot = next free slot: the next min(remaining, room) elements of t
//   each table: num_blocks = ceil(elements / chunk_elements)
// So a model needs ceil(non-empty tensors / max_tensors) launches (below 2^30 elements per
// launch), and at most one block per launch is partly idle. `max_tensors` may be lowered
// below the table capacity (tests do). Defined for SmallLaunchTable and LargeLaunchTable.
template <class Table>
std::vector<Table> PlanLaunches(const TensorRef* tensors, int num_tensors,
                                int64_t chunk_elements = kGpuChunkElements,
                                int max_tensors = Table::kCapacity);

// Whether launches of at most `max_tensors` slots need LargeLaunchTable: more slots than a
// SmallLaunchTable holds would be filled, i.e. min(max_tensors, non-empty tensors) > 203
// (a tensor cut into pieces, past 2^30 elements, is counted once: its pieces fill launches
// of their own).
bool NeedsLargeTables(const TensorRef* tensors, int num_tensors, int max_tensors);

}  // namespace tfamp

#endif  // TFAMP_LAUNCH_PLAN_H_

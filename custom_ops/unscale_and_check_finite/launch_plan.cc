#include "launch_plan.h"

#include <algorithm>

namespace tfamp {
namespace {

int64_t NumChunks(int64_t size, int64_t chunk_elements) {
  return (size + chunk_elements - 1) / chunk_elements;
}

// Appends an empty table: resize value-initializes it, all zero (unused slots are passed to
// the kernel, never read).
template <class Table>
void Open(std::vector<Table>* launches, int64_t chunk_elements) {
  launches->resize(launches->size() + 1);
  launches->back().chunk_elements = chunk_elements;
}

template <class Table>
void Close(Table* table) {
  table->num_blocks =
      static_cast<int32_t>(NumChunks(LaunchElements(*table), table->chunk_elements));
}

}  // namespace

ChunkIndex::ChunkIndex(const TensorRef* tensors, int num_tensors, int64_t chunk_elements)
    : chunk_elements_(chunk_elements), first_chunk_(num_tensors + 1, 0) {
  for (int i = 0; i < num_tensors; ++i) {
    first_chunk_[i + 1] = first_chunk_[i] + NumChunks(tensors[i].size, chunk_elements);
  }
}

void ChunkIndex::Locate(int64_t chunk, int* tensor, int64_t* chunk_in_tensor) const {
  // The last tensor whose first chunk is <= chunk; empty tensors own no chunk and are skipped.
  const std::vector<int64_t>::const_iterator it =
      std::upper_bound(first_chunk_.begin(), first_chunk_.end(), chunk) - 1;
  *tensor = static_cast<int>(it - first_chunk_.begin());
  *chunk_in_tensor = chunk - *it;
}

template <class Table>
std::vector<Table> PlanLaunches(const TensorRef* tensors, int num_tensors,
                                int64_t chunk_elements, int max_tensors) {
  std::vector<Table> launches;  // filled in place: a LargeLaunchTable is 32 KB
  for (int t = 0; t < num_tensors; ++t) {
    const int64_t bytes = ElementBytes(tensors[t].type);
    for (int64_t done = 0; done < tensors[t].size;) {
      if (launches.empty() || launches.back().num_tensors == max_tensors ||
          LaunchElements(launches.back()) == kMaxElementsPerLaunch) {
        if (!launches.empty()) Close(&launches.back());
        Open(&launches, chunk_elements);
      }
      Table& table = launches.back();
      const int64_t start = LaunchElements(table);
      const int64_t piece = std::min(tensors[t].size - done, kMaxElementsPerLaunch - start);
      const int slot = table.num_tensors++;
      table.in[slot] = static_cast<const char*>(tensors[t].in) + done * bytes;
      table.out[slot] = static_cast<char*>(tensors[t].out) + done * bytes;
      table.slot_start[slot] = static_cast<uint32_t>(start) |
                               static_cast<uint32_t>(tensors[t].type) << kSlotTypeShift;
      table.slot_start[slot + 1] = static_cast<uint32_t>(start + piece);
      done += piece;
    }
  }
  if (!launches.empty()) Close(&launches.back());
  return launches;
}

template std::vector<SmallLaunchTable> PlanLaunches<SmallLaunchTable>(const TensorRef*, int,
                                                                      int64_t, int);
template std::vector<LargeLaunchTable> PlanLaunches<LargeLaunchTable>(const TensorRef*, int,
                                                                      int64_t, int);

bool NeedsLargeTables(const TensorRef* tensors, int num_tensors, int max_tensors) {
  int non_empty = 0;
  for (int t = 0; t < num_tensors; ++t) non_empty += tensors[t].size > 0;
  return std::min(max_tensors, non_empty) > kSmallTableSlots;
}

}  // namespace tfamp

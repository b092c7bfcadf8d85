#include "launch_plan.h"

#include <algorithm>
#include <cstring>

namespace tfamp {
namespace {

int64_t NumChunks(int64_t size, int64_t chunk_elements) {
  return (size + chunk_elements - 1) / chunk_elements;
}

LaunchTable EmptyTable(int64_t chunk_elements) {
  LaunchTable table;
  std::memset(&table, 0, sizeof(table));
  table.chunk_elements = chunk_elements;
  return table;
}

LaunchTable Closed(LaunchTable table) {
  table.num_blocks =
      static_cast<int32_t>(NumChunks(LaunchElements(table), table.chunk_elements));
  return table;
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

std::vector<LaunchTable> PlanLaunches(const TensorRef* tensors, int num_tensors,
                                      int64_t chunk_elements, int max_tensors) {
  std::vector<LaunchTable> launches;
  LaunchTable table = EmptyTable(chunk_elements);
  for (int t = 0; t < num_tensors; ++t) {
    const int64_t bytes = ElementBytes(tensors[t].type);
    for (int64_t done = 0; done < tensors[t].size;) {
      if (table.num_tensors == max_tensors || LaunchElements(table) == kMaxElementsPerLaunch) {
        launches.push_back(Closed(table));
        table = EmptyTable(chunk_elements);
      }
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
  if (table.num_tensors > 0) launches.push_back(Closed(table));
  return launches;
}

}  // namespace tfamp

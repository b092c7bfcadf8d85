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
      static_cast<int32_t>(NumChunks(table.first[table.num_tensors], table.chunk_elements));
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
    if (tensors[t].size == 0) continue;
    if (table.num_tensors == max_tensors) {
      launches.push_back(Closed(table));
      table = EmptyTable(chunk_elements);
    }
    const int slot = table.num_tensors++;
    table.in[slot] = tensors[t].in;
    table.out[slot] = tensors[t].out;
    table.type[slot] = tensors[t].type;
    table.first[slot + 1] = table.first[slot] + tensors[t].size;
  }
  if (table.num_tensors > 0) launches.push_back(Closed(table));
  return launches;
}

}  // namespace tfamp

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
                                      int64_t chunk_elements, int max_tensors, int max_blocks) {
  std::vector<LaunchTable> launches;
  LaunchTable table = EmptyTable(chunk_elements);
  for (int t = 0; t < num_tensors; ++t) {
    const int64_t chunks = NumChunks(tensors[t].size, chunk_elements);
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || table.num_blocks == 0) {  // this tensor needs a slot in this table
        if (table.num_tensors == max_tensors) {
          launches.push_back(table);
          table = EmptyTable(chunk_elements);
        }
        const int slot = table.num_tensors++;
        table.in[slot] = tensors[t].in;
        table.out[slot] = tensors[t].out;
        table.size[slot] = tensors[t].size;
        table.type[slot] = tensors[t].type;
      }
      table.block_slot[table.num_blocks] = static_cast<uint8_t>(table.num_tensors - 1);
      table.block_chunk[table.num_blocks] = static_cast<int32_t>(c);
      if (++table.num_blocks == max_blocks) {
        launches.push_back(table);
        table = EmptyTable(chunk_elements);
      }
    }
  }
  if (table.num_blocks > 0) launches.push_back(table);
  return launches;
}

}  // namespace tfamp

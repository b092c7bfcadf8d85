// Test-only C entry points to the work partitioning of custom_ops/unscale_and_check_finite
// (launch_plan.h), loaded with ctypes by tests/fused_op/test_fused_op_launch_plan.py.
//
// Tensors get fake, never dereferenced addresses that encode their index, so the test can
// tell which tensor each LaunchTable slot refers to.
#include <cstdint>
#include <vector>

#include "launch_plan.h"

namespace {

// Beyond any piece offset a plan makes (kMaxElementsPerLaunch float32 elements is 4 GiB).
const uintptr_t kFakeStride = uintptr_t{1} << 40;

std::vector<tfamp::TensorRef> FakeTensors(const int64_t* sizes, const int32_t* types, int n) {
  std::vector<tfamp::TensorRef> tensors(n);
  for (int i = 0; i < n; ++i) {
    tensors[i].in = reinterpret_cast<const void*>((i + 1) * kFakeStride);
    tensors[i].out = reinterpret_cast<void*>((i + 1) * kFakeStride + 8);
    tensors[i].size = sizes[i];
    tensors[i].type = static_cast<tfamp::ElementType>(types[i]);
  }
  return tensors;
}

// A plan in `Table`s, flattened as tfamp_test_plan_launches describes.
template <class Table>
std::vector<int64_t> FlatPlan(const std::vector<tfamp::TensorRef>& tensors,
                              int64_t chunk_elements, int max_tensors) {
  const std::vector<Table> plan = tfamp::PlanLaunches<Table>(
      tensors.data(), static_cast<int>(tensors.size()), chunk_elements, max_tensors);
  std::vector<int64_t> flat;
  for (const Table& t : plan) {
    std::vector<int64_t> parts;
    for (int b = 0; b < t.num_blocks; ++b) {
      tfamp::ForEachPartOfBlock(t, tfamp::BlockElements(t, b),
                                [&parts, b](int slot, tfamp::ElementRange part) {
                                  parts.push_back(b);
                                  parts.push_back(slot);
                                  parts.push_back(part.begin);
                                  parts.push_back(part.end);
                                });
    }
    flat.push_back(t.num_tensors);
    flat.push_back(t.num_blocks);
    flat.push_back(t.chunk_elements);
    flat.push_back(static_cast<int64_t>(parts.size() / 4));
    for (int s = 0; s < t.num_tensors; ++s) {
      const uintptr_t in = reinterpret_cast<uintptr_t>(t.in[s]);
      flat.push_back(static_cast<int64_t>(in / kFakeStride) - 1);
      flat.push_back(tfamp::SlotStart(t, s));
      flat.push_back(tfamp::SlotStart(t, s + 1) - tfamp::SlotStart(t, s));
      flat.push_back(tfamp::SlotType(t, s));
      flat.push_back(reinterpret_cast<uintptr_t>(t.out[s]) == in + 8 ? 1 : 0);
      flat.push_back(static_cast<int64_t>(in % kFakeStride) /
                     tfamp::ElementBytes(tfamp::SlotType(t, s)));
    }
    flat.insert(flat.end(), parts.begin(), parts.end());
  }
  return flat;
}

}  // namespace

extern "C" {

// The planner's limits: the capacities of the two launch tables, and the CUDA kernel's
// elements per block.
void tfamp_test_plan_limits(int* small_table_slots, int* large_table_slots,
                            int64_t* chunk_elements) {
  *small_table_slots = tfamp::SmallLaunchTable::kCapacity;
  *large_table_slots = tfamp::LargeLaunchTable::kCapacity;
  *chunk_elements = tfamp::kGpuChunkElements;
}

// 1 when launches of at most `max_tensors` slots need the large table for this list.
int tfamp_test_needs_large_tables(const int64_t* sizes, int n, int max_tensors) {
  std::vector<int32_t> types(n, 0);
  const std::vector<tfamp::TensorRef> tensors = FakeTensors(sizes, types.data(), n);
  return tfamp::NeedsLargeTables(tensors.data(), n, max_tensors) ? 1 : 0;
}

// Writes, for each launch of PlanLaunches in tables of `table_slots` (the small or the large
// table's capacity):
//   num_tensors, num_blocks, chunk_elements, number of parts,
//   per slot: tensor index, first, size, element type, 1 if `out` belongs to the same tensor,
//             the slot's first element within its tensor (nonzero for a tensor's later pieces)
//   per part (ForEachPartOfBlock, block after block, as the kernel walks them):
//             block, slot, first element, end element
// Returns the number of int64 written, -1 if `capacity` is too small, -2 for an unknown
// table.
int64_t tfamp_test_plan_launches(const int64_t* sizes, const int32_t* types, int n,
                                 int64_t chunk_elements, int max_tensors, int table_slots,
                                 int64_t* out, int64_t capacity) {
  const std::vector<tfamp::TensorRef> tensors = FakeTensors(sizes, types, n);
  std::vector<int64_t> flat;
  if (table_slots == tfamp::SmallLaunchTable::kCapacity) {
    flat = FlatPlan<tfamp::SmallLaunchTable>(tensors, chunk_elements, max_tensors);
  } else if (table_slots == tfamp::LargeLaunchTable::kCapacity) {
    flat = FlatPlan<tfamp::LargeLaunchTable>(tensors, chunk_elements, max_tensors);
  } else {
    return -2;
  }
  if (static_cast<int64_t>(flat.size()) > capacity) return -1;
  for (size_t i = 0; i < flat.size(); ++i) out[i] = flat[i];
  return static_cast<int64_t>(flat.size());
}

// The CPU kernel's work items: for every global chunk, (tensor, first element, end element).
// Returns the number of chunks, or -1 if `capacity` (in chunks) is too small.
int64_t tfamp_test_cpu_chunks(const int64_t* sizes, int n, int64_t chunk_elements,
                              int64_t* out, int64_t capacity) {
  std::vector<int32_t> types(n, 0);
  const std::vector<tfamp::TensorRef> tensors = FakeTensors(sizes, types.data(), n);
  const tfamp::ChunkIndex index(tensors.data(), n, chunk_elements);
  if (index.num_chunks() > capacity) return -1;
  for (int64_t c = 0; c < index.num_chunks(); ++c) {
    int tensor;
    int64_t chunk;
    index.Locate(c, &tensor, &chunk);
    const tfamp::ElementRange r = tfamp::ChunkElements(chunk, chunk_elements, sizes[tensor]);
    out[3 * c] = tensor;
    out[3 * c + 1] = r.begin;
    out[3 * c + 2] = r.end;
  }
  return index.num_chunks();
}

}  // extern "C"

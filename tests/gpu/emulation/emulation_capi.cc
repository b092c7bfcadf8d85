// The grid emulation's globals, and C entry points that steer it (loaded with ctypes).
#include <cstdint>

#include "cuda_runtime.h"

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

extern "C" {

// order: 0 in order, 1 reversed, 2 shuffled (seeded by `seed` and the launch's number).
void tfamp_emulation_set_thread_order(int order, uint64_t seed) {
  cuda_emulation::State().order = static_cast<cuda_emulation::ThreadOrder>(order);
  cuda_emulation::State().seed = seed;
}

// execute == 0: launches are checked and counted, but no thread runs.
void tfamp_emulation_set_execute(int execute) { cuda_emulation::State().execute = execute != 0; }

// What cudaDriverGetVersion answers from now on (1000 * major + 10 * minor: 12000 is 12.0).
void tfamp_emulation_set_driver_version(int version) {
  cuda_emulation::State().driver_version = version;
}

// capturing != 0: cudaStreamIsCapturing says every stream is being captured into a graph.
void tfamp_emulation_set_capturing(int capturing) {
  cuda_emulation::State().capturing = capturing != 0;
}

// refuse != 0: launches with over 4 KB of parameters fail whatever driver version is reported.
void tfamp_emulation_set_refuse_large_launches(int refuse) {
  cuda_emulation::State().refuse_large_launches = refuse != 0;
}

// Launches, blocks and threads since the last call; resets the counts.
void tfamp_emulation_take_counters(int64_t* launches, int64_t* blocks, int64_t* threads) {
  cuda_emulation::LaunchCounters& counters = cuda_emulation::State().counters;
  *launches = counters.launches;
  *blocks = counters.blocks;
  *threads = counters.threads;
  counters.launches = counters.blocks = counters.threads = 0;
}

}  // extern "C"

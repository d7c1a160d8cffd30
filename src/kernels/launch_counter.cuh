// Per-launch sequences in device memory, read by every block at its start, advanced once per launch (graph
// replays too).
#pragma once

#include <cstdint>

#include "braid/device/sync_device.hpp"

namespace braid::kernels {

// Every thread of the block calls it; one load per block.
__device__ inline uint64_t read_launch_counter(const uint64_t* counter) {
  __shared__ uint64_t value;
  if (threadIdx.x == 0) value = *counter;
  __syncthreads();
  return value;
}

// And whether this rank had stopped (NOTE [stopped ranks]), in one round of loads.
struct LaunchStart {
  uint64_t counter;
  bool stopped;
};
__device__ inline LaunchStart read_launch_start(const uint64_t* counter, const device::SignalPad& pad) {
  __shared__ uint64_t value;
  __shared__ int stopped;
  if (threadIdx.x == 0) {
    const uint64_t read = *counter;  // both loads in flight before either store waits
    const bool read_stopped = device::rank_stopped(pad);
    value = read;
    stopped = read_stopped;
  }
  __syncthreads();
  return LaunchStart{value, stopped != 0};
}

// `counter` = `read` + 1 once every block's `thread` (one that does not wait) counted in; safe early, as the next
// launch reads it only after this one completed. Call it ahead of the block's waits so the atomic overlaps them.
__device__ inline void advance_once_read(uint64_t* counter, unsigned int* blocks_done, uint64_t read,
                                         unsigned int thread = 0) {
  if (threadIdx.x != thread) return;
  if (gridDim.x == 1) {
    *counter = read + 1;
  } else if (atomicAdd(blocks_done, 1u) == gridDim.x - 1) {
    *blocks_done = 0;
    *counter = read + 1;
  }
}

// Called by every block at its end.
__device__ inline void advance_after_last_block(uint64_t* counter, unsigned int* blocks_done) {
  __syncthreads();
  if (threadIdx.x == 0 && gridDim.x == 1) {
    *counter += 1;
  } else if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(blocks_done, 1u) == gridDim.x - 1) {
      *blocks_done = 0;
      *counter += 1;
    }
  }
}

}  // namespace braid::kernels

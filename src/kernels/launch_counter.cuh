// The per-launch counters of braid's kernels: a sequence in device memory that every block of a launch reads at
// its start (LL flags, staging and multicast halves by parity) and that advances once per launch, so that graph
// replays advance it too; `blocks_done` counts the blocks of a launch that are past their read.
#pragma once

#include <cstdint>

#include "braid/device/sync_device.hpp"

namespace braid::kernels {

// A per-launch sequence in device memory (`counter`: launches so far, so graph replays advance it too) as this
// launch's blocks read it at their start. Every thread of the block calls it; one load per block.
__device__ inline uint64_t read_launch_counter(const uint64_t* counter) {
  __shared__ uint64_t value;
  if (threadIdx.x == 0) value = *counter;
  __syncthreads();
  return value;
}

// read_launch_counter, and whether this rank had stopped (NOTE [stopped ranks], device::rank_stopped) when the
// block started, in one round of loads: a kernel whose first stores a peer may read decides on both at once.
struct LaunchStart {
  uint64_t counter;
  bool stopped;
};
__device__ inline LaunchStart read_launch_start(const uint64_t* counter, const device::SignalPad& pad) {
  __shared__ uint64_t value;
  __shared__ int stopped;
  if (threadIdx.x == 0) {
    const uint64_t read = *counter;  // both loads in flight before either shared store waits for its value
    const bool read_stopped = device::rank_stopped(pad);
    value = read;
    stopped = read_stopped;
  }
  __syncthreads();
  return LaunchStart{value, stopped != 0};
}

// Advances `counter` past `read`, the value every block of this launch read at its start (read_launch_counter),
// once they all have: thread `thread` of each block counts its block in, and the last one stores read + 1 and
// re-arms `blocks_done` (a launch of one block stores it directly). The next launch reads the counter only after
// this one has completed. Call it right after the block's first stores and ahead of its waits for peers, so that
// the atomic's round trip overlaps those waits instead of ending the kernel (`thread`: one that does not wait).
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

// Called by every block at its end: the last block of the launch to finish advances `counter` and re-arms
// `blocks_done`; a launch of one block advances it directly. The fence and the atomic then end the kernel:
// kernels that can count their blocks in earlier use advance_once_read.
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

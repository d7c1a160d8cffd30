// The staged kernels' skeleton (run_staged): slice into this rank's staging half, entry barrier, peers' staging
// into the output. Calls alternate halves; call k+2 starts only after call k+1's entry barrier, which every peer
// entered after finishing call k (stream order): no half is rewritten while a peer reads it.
#pragma once

#include "kernels/elementwise.cuh"
#include "kernels/launch_counter.cuh"
#include "kernels/staged_launch.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {

struct StagingView {
  uint64_t epoch;  // its parity picks the half
  size_t offset;
  bool stopped;    // NOTE [stopped ranks]
  __device__ char* of(const StagedLaunch& launch, int rank) const { return launch.staging[rank] + offset; }
};

// This call's half (`epoch`'s parity). Every thread calls it.
__device__ inline size_t parity_half(const uint64_t* epoch, size_t half_bytes) {
  return (read_launch_counter(epoch) & 1) * half_bytes;
}

__device__ inline StagingView staging_view(const StagedLaunch& launch) {
  const LaunchStart start = read_launch_start(launch.epoch, launch.pad);
  return StagingView{start.counter, (start.counter & 1) * launch.half_bytes, start.stopped};
}

// Every block: copy_in, the entry barrier (announcing launch.plan), read_out; a failed barrier (recorded) ends the
// block. A stopped rank writes no staging (a peer may still read that half) and only answers (NOTE [stopped ranks]).
template <typename Element, typename CopyIn, typename ReadOut>
__device__ __forceinline__ void run_staged(const StagedLaunch& launch, CopyIn&& copy_in, ReadOut&& read_out) {
  const StagingView staging = staging_view(launch);
  if (staging.stopped) {
    device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteEntryBarrier, launch.plan);
    return;
  }
  const Slice slice = block_slice<Element>(launch.count, blockIdx.x, gridDim.x);
  copy_in(staging, slice);
  advance_once_read(launch.epoch, launch.blocks_done, staging.epoch);
  if (!device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  read_out(staging, slice);
}

// Part `part` of `parts` of a slice in whole vectors, the last with the tail.
template <typename T>
__device__ __forceinline__ Slice slice_part(const Slice& slice, int part, int parts) {
  constexpr size_t kPer = Vector<T>::kCount;
  const size_t vectors = (slice.vector_end - slice.begin) / kPer;
  const size_t base = vectors / parts, extra = vectors % parts, p = static_cast<size_t>(part);
  Slice piece;
  piece.begin = slice.begin + (p * base + (p < extra ? p : extra)) * kPer;
  piece.vector_end = piece.begin + (base + (p < extra ? 1 : 0)) * kPer;
  piece.end = part == parts - 1 ? slice.end : piece.vector_end;
  return piece;
}

// run_staged with a middle barrier (Algorithm::kSplit): `first` on this rank's part, `second` on the others'.
template <typename Element, typename CopyIn, typename First, typename Second>
__device__ __forceinline__ void run_staged_split(const StagedLaunch& launch, CopyIn&& copy_in, First&& first,
                                                 Second&& second) {
  run_staged<Element>(launch, copy_in, [&](const StagingView& staging, const Slice& slice) {
    first(staging, slice);
    if (!device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteMiddleBarrier, launch.plan)) return;
    second(staging, slice);
  });
}

template <typename Element>
__device__ __forceinline__ void copy_slice_in(const StagedLaunch& launch, const StagingView& staging, const Slice& slice) {
  block_copy(staging.of(launch, launch.pad.rank) + slice.begin * sizeof(Element), launch.send + slice.begin * sizeof(Element),
             (slice.end - slice.begin) * sizeof(Element));
}

// Reduces, in rank order, the slice at byte `offset` of every rank's half into `destination`.
template <typename T, ReduceOp Op>
__device__ __forceinline__ void reduce_staging(const StagedLaunch& launch, const StagingView& staging, size_t offset,
                                               const Slice& slice, char* destination) {
  const int world = launch.pad.world;
  const char* sources[kMaxWorld];
  for (int r = 0; r < world; ++r) sources[r] = staging.of(launch, r) + offset;
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &destination, 1, slice, 0, 0, world);
}

}  // namespace braid::kernels

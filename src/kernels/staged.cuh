// What every staged collective kernel receives, and the skeleton they share (run_staged): copy this block's
// slice of the input into this rank's staging half, one entry barrier with every peer, read the peers' staging
// (copy or reduce into the output); the epoch advances once every block has read it.
//
// Why parity halves: a rank copies its input into its own staging before the entry barrier, while a slow peer
// may still be reading that staging from the previous call. Calls alternate halves, and a rank reaches call
// k+2 only after its call k+1 passed an entry barrier with every peer, which every peer entered only after its
// call k had finished (kernels of one stream run in order). So no half is rewritten while a peer reads it.
#pragma once

#include "kernels/elementwise.cuh"
#include "kernels/launch_counter.cuh"
#include "kernels/staged_launch.hpp"
#include "sync/device_sync.hpp"  // wait sites

namespace braid::kernels {

// The staging half this launch uses, of `rank`. Read once per block at kernel start (staging_view).
struct StagingView {
  uint64_t epoch;  // launch.epoch as this launch read it: its parity picks the half
  size_t offset;   // of this call's half within every rank's staging
  bool stopped;    // this rank had stopped when the block started (NOTE [stopped ranks])
  __device__ char* of(const StagedLaunch& launch, int rank) const { return launch.staging[rank] + offset; }
};

// Offset of the half a launch uses in a two-half buffer whose calls alternate by `epoch`'s parity (staging here,
// the multicast region in multicast.cuh). Every thread of the block calls it.
__device__ inline size_t parity_half(const uint64_t* epoch, size_t half_bytes) {
  return (read_launch_counter(epoch) & 1) * half_bytes;
}

__device__ inline StagingView staging_view(const StagedLaunch& launch) {
  const LaunchStart start = read_launch_start(launch.epoch, launch.pad);
  return StagingView{start.counter, (start.counter & 1) * launch.half_bytes, start.stopped};
}

// The staged skeleton, run by every block of a staged kernel: `copy_in(staging, slice)` writes this block's
// slice (of launch.count elements of Element, split between the blocks in whole vectors) into this rank's
// staging half; after the entry barrier (block b of every rank is channel b, announcing launch.plan),
// `read_out(staging, slice)` reads the peers' halves into the output. A failed barrier (timeout, plan mismatch,
// recorded for the host) ends the block before it reads anything. On a stopped rank the block writes no staging
// (a peer may still read the half from two calls ago) and its barrier only answers (NOTE [stopped ranks]).
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

// Part `part` of `parts` of a block's slice, in whole vectors of T (the slice's scalar tail goes with the last part).
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

// The staged skeleton in two phases (Algorithm::kSplit): `copy_in` as in run_staged; after the entry barrier `first(staging, slice)`
// (each rank works on its own part of the slice, slice_part), and after a second barrier on the same channel
// `second(staging, slice)` (each rank reads the parts the others made). The staging half is the same in both
// phases, so run_staged's argument for reusing halves holds: a peer reads this rank's part of the half in
// `second`, and this rank rewrites the half only two calls later.
template <typename Element, typename CopyIn, typename First, typename Second>
__device__ __forceinline__ void run_staged_split(const StagedLaunch& launch, CopyIn&& copy_in, First&& first,
                                                 Second&& second) {
  run_staged<Element>(launch, copy_in, [&](const StagingView& staging, const Slice& slice) {
    first(staging, slice);
    if (!device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteMiddleBarrier, launch.plan)) return;
    second(staging, slice);
  });
}

// The copy-in step of the kernels whose staging holds the input as it is: this block's slice of the input into the
// same place in this rank's staging half.
template <typename Element>
__device__ __forceinline__ void copy_slice_in(const StagedLaunch& launch, const StagingView& staging, const Slice& slice) {
  block_copy(staging.of(launch, launch.pad.rank) + slice.begin * sizeof(Element), launch.send + slice.begin * sizeof(Element),
             (slice.end - slice.begin) * sizeof(Element));
}

// Reduces, in rank order, `count`-element slice `slice` at byte `offset` of every rank's staging half into
// `destination` (every rank computes identical results from identical inputs).
template <typename T, ReduceOp Op>
__device__ __forceinline__ void reduce_staging(const StagedLaunch& launch, const StagingView& staging, size_t offset,
                                               const Slice& slice, char* destination) {
  const int world = launch.pad.world;
  const char* sources[kMaxWorld];
  for (int r = 0; r < world; ++r) sources[r] = staging.of(launch, r) + offset;
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &destination, 1, slice, 0, 0, world);  // sources: peers' staging
}

}  // namespace braid::kernels

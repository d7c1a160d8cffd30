// Arguments of the announcing kernels (plain data, by value): eager calls whose buffers the peers may map through
// exposure (docs/dev/registration.md, "Eager zero copy on registered memory"). Each rank announces, at the entry
// barrier, where each of its buffers lies (an exposure id and an offset) or that it has none; every rank then
// finds the peers' buffers in its exposure table and moves the data zero copy, or, where any rank announced none,
// every rank runs the staged path inside the same kernel (kernels/announced.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"
#include "kernels/staged_launch.hpp"
#include "memory/exposure_table.hpp"

namespace braid::kernels {

// An announcement: kAnnouncedStaged, or (exposure id << kAnnouncedOffsetBits) | offset in the exposed range.
constexpr uint64_t kAnnouncedStaged = 1;
constexpr int kAnnouncedOffsetBits = 40;
constexpr uint64_t kAnnouncedOffsetMask = (uint64_t(1) << kAnnouncedOffsetBits) - 1;
constexpr uint64_t kMaxAnnouncedId = (uint64_t(1) << (64 - kAnnouncedOffsetBits)) - 1;

// The announcement of a buffer at `offset` of exposure `id`; staged where either does not fit its bits.
constexpr uint64_t announcement(uint64_t id, uint64_t offset) {
  return id == 0 || id > kMaxAnnouncedId || offset > kAnnouncedOffsetMask ? kAnnouncedStaged
                                                                          : (id << kAnnouncedOffsetBits) | offset;
}

// Buffers a call announces: all-gather and all-to-all their output, reduce-scatter its input, all-reduce its input
// and output.
constexpr int kAnnouncedBuffers = 2;

// Words of one rank's announcement area: [channel][sender][parity of the barrier's count][buffer] (as the signal
// pad's plan words): each block announces to the same block of every peer.
constexpr size_t announcement_words(int world, int channels) {
  return size_t(channels) * size_t(world) * 2 * kAnnouncedBuffers;
}

struct AnnouncementArea {
  uint64_t* local;         // this rank's area
  uint64_t* const* peers;  // device array [world]: every rank's area, mapped here
};

// Where a rank finds the ranges its peers exposed: [world * kExposureSlots] each (NOTE [exposure cache]).
struct ExposureLookup {
  const ExposedRange* table;  // the exposure table (pinned host memory, filled by the exposure helper)
  ExposedRange* cache;        // its copy in this GPU's memory, filled by the kernels that look slots up
};

struct AnnouncedLaunch {
  StagedLaunch staged;  // the call and the staging its staged path uses (count and rank_stride: see each kernel)
  int buffers;          // how many it announces, at most kAnnouncedBuffers
  uint64_t words[kAnnouncedBuffers];     // this rank's announcement of each
  size_t extents[kAnnouncedBuffers];     // the bytes each rank's buffer holds (the same on every rank)
  AnnouncementArea area;
  ExposureLookup exposures;
};

// All-gather (count, rank_stride: bytes), buffer 0 its output.
void launch_all_gather_announced(const AnnouncedLaunch& launch, int blocks, cudaStream_t stream);
// Reduce-scatter (count: elements of the output, rank_stride: elements between input blocks), buffer 0 its input.
void launch_reduce_scatter_announced(DataType type, ReduceOp op, const AnnouncedLaunch& launch, int blocks,
                                     cudaStream_t stream);
// All-to-all (count, rank_stride: bytes of one block), buffer 0 its output.
void launch_all_to_all_announced(const AnnouncedLaunch& launch, int blocks, cudaStream_t stream);
// All-reduce, two shot (count: elements), buffer 0 its input, 1 its output.
void launch_all_reduce_announced(DataType type, ReduceOp op, const AnnouncedLaunch& launch, int blocks,
                                 cudaStream_t stream);

}  // namespace braid::kernels

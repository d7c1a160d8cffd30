// Arguments of the pipelined kernels (plain data, by value) and their FIFOs' sizes (pipeline.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"

namespace braid::kernels {

constexpr int kFifoDepth = 4;           // a power of two
constexpr int kPipelineChannels = 64;   // blocks a pipelined launch may use
constexpr int kPipelinePhases = 2;

// Signal-pad channel sets, kPipelineChannels wide each.
enum PadChannelSet : int {
  kBarrierSet = 0, kData1 = 1, kFree1 = 2, kData2 = 3, kFree2 = 4, kBulkSet = 5, kPadChannelSets = 6
};
constexpr int kPadChannels = kPadChannelSets * kPipelineChannels;
static_assert(kPipelineChannels == device::kBarrierChannels, "the barrier set is the pad's barrier channels");

// One FIFO slot's bytes (a multiple of 256); 0 if the area is too small.
constexpr size_t pipeline_piece_bytes(size_t area_bytes, int world) {
  return area_bytes / (size_t(kPipelinePhases) * kPipelineChannels * world * kFifoDepth) / 256 * 256;
}

// Peer masks: bit p is rank p.
constexpr unsigned int kEveryPeer = ~0u;

struct PipelineLaunch {
  const char* send;
  char* recv;
  size_t count;        // elements (all-gather: bytes)
  size_t rank_stride;  // bytes between rank blocks
  unsigned int collective;
  char* const* area;   // device array [world]
  size_t piece_bytes;
  device::SignalPad pad;
  int root = -1;       // reduce, broadcast
  uint64_t plan = 0;
};

}  // namespace braid::kernels

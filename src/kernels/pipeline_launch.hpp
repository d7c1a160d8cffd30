// The arguments of every pipelined collective kernel (plain data, passed by value), and the layout of the
// pipeline area: per (phase, channel, sender) a FIFO of kFifoDepth slots of piece_bytes each, in every
// rank's symmetric pipeline buffer. Senders push pieces into the receiver's FIFO with NVLink stores; slots are
// handed back with credits (see pipeline.cuh), so no slot is rewritten while its receiver may still read it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"

namespace braid::kernels {

constexpr int kFifoDepth = 4;           // slots per FIFO; a power of two
constexpr int kPipelineChannels = 64;   // blocks a pipelined launch may use
constexpr int kPipelinePhases = 2;      // all-reduce: reduce-scatter pieces, then reduced pieces

// Signal-pad channel sets (each kPipelineChannels wide, after the staged kernels' barrier channels): "data"
// counts pieces a sender posted, "free" counts slots a receiver handed back. kBulkSet: the copy-engine send/recv
// (send_recv_bulk_launch.hpp) counts chunks on its first two channels.
enum PadChannelSet : int {
  kBarrierSet = 0, kData1 = 1, kFree1 = 2, kData2 = 3, kFree2 = 4, kBulkSet = 5, kPadChannelSets = 6
};
constexpr int kPadChannels = kPadChannelSets * kPipelineChannels;
static_assert(kPipelineChannels == device::kBarrierChannels, "the barrier set is the pad's barrier channels");

// Bytes of one FIFO slot for a pipeline area of `area_bytes` (a multiple of 256, so slots of any element type
// stay 16-byte aligned); 0 when the area is too small.
constexpr size_t pipeline_piece_bytes(size_t area_bytes, int world) {
  return area_bytes / (size_t(kPipelinePhases) * kPipelineChannels * world * kFifoDepth) / 256 * 256;
}

// Peers as a bit mask (bit p: rank p); kEveryPeer selects all of them.
constexpr unsigned int kEveryPeer = ~0u;

struct PipelineLaunch {
  const char* send;
  char* recv;
  size_t count;        // elements: all-reduce the buffer, reduce-scatter one rank block, all-gather (bytes) one rank's input
  size_t rank_stride;  // bytes between consecutive rank blocks of the user's buffer (reduce-scatter send, all-gather recv)
  unsigned int collective;
  char* const* area;   // device array [world]: every rank's pipeline area
  size_t piece_bytes;  // bytes of one FIFO slot
  device::SignalPad pad;
  int root = -1;       // reduce, broadcast: the root; -1 for the others
  uint64_t plan = 0;   // collectives/plan.hpp: checked against a peer's barrier announcements while waiting
};

}  // namespace braid::kernels

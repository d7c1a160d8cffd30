// Send/recv pairs in LL128 lines (send_recv_lines.cu): one launch, no signal. The sender stores the message into
// its slot of the receiver's area as lines flagged with the pair's sequence (device counts only the kernel
// advances); the receiver polls for that flag. Parity slots, consumption and refusal: docs/dev/protocol.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "kernels/ll128_launch.hpp"
#include "core/limits.hpp"

namespace braid::kernels {

constexpr size_t kSendRecvLinesMaxPayload = size_t(256) << 10;
constexpr size_t kSendRecvLinesGroups = 1 + (kSendRecvLinesMaxPayload + kLL128WarpPayload - 1) / kLL128WarpPayload;
constexpr size_t kSendRecvLinesSlotBytes = kSendRecvLinesGroups * kLL128WarpWire;
constexpr int kSendRecvLinesMaxPeers = kMaxWorld;

// One rank's area: the counts, then [parity 2][sender world] slots.
struct SendRecvLinesCounts {
  uint64_t sent[kSendRecvLinesMaxPeers];
  uint64_t received[kSendRecvLinesMaxPeers];
  uint64_t consumed[kSendRecvLinesMaxPeers];  // [r]: this rank's messages that r consumed (r stores)
  // Blocks done with the message to / from each peer; the last advances the count and re-arms this.
  unsigned int sends_finished[kSendRecvLinesMaxPeers];
  unsigned int receives_finished[kSendRecvLinesMaxPeers];
};
constexpr size_t kSendRecvLinesCountsBytes = (sizeof(SendRecvLinesCounts) + kLL128WarpWire - 1) / kLL128WarpWire * kLL128WarpWire;
constexpr size_t send_recv_lines_area_bytes(int world) {
  return kSendRecvLinesCountsBytes + 2 * static_cast<size_t>(world) * kSendRecvLinesSlotBytes;
}

// One direction of a pair.
struct SendRecvLinesPair {
  int peer;
  char* buffer;  // send: read only
  uint64_t bytes;
  int blocks;
};

// One round a block, up to kSendRecvLinesMaxBlocks blocks.
constexpr int kSendRecvLinesThreads = 512;
constexpr int kSendRecvLinesGroupsPerWarp = 4;
constexpr uint64_t kSendRecvLinesBlockGroups = uint64_t(kSendRecvLinesThreads / 32) * kSendRecvLinesGroupsPerWarp;
constexpr int kSendRecvLinesMaxBlocks = 8;
__host__ __device__ constexpr uint64_t send_recv_lines_groups(uint64_t bytes) { return 1 + (bytes + kLL128WarpPayload - 1) / kLL128WarpPayload; }
__host__ __device__ constexpr int send_recv_lines_blocks(uint64_t bytes) {
  const uint64_t blocks = (send_recv_lines_groups(bytes) + kSendRecvLinesBlockGroups - 1) / kSendRecvLinesBlockGroups;
  return blocks < uint64_t(kSendRecvLinesMaxBlocks) ? static_cast<int>(blocks) : kSendRecvLinesMaxBlocks;
}

// The sends' blocks first, then the receives'.
struct SendRecvLinesLaunch {
  SendRecvLinesPair sends[kSendRecvLinesMaxPeers];
  SendRecvLinesPair recvs[kSendRecvLinesMaxPeers];
  int send_count;
  int recv_count;
  int blocks;  // in all
  char* area[kMaxWorld];
  device::SignalPad pad;
};

void launch_send_recv_lines(const SendRecvLinesLaunch& launch, cudaStream_t stream);

}  // namespace braid::kernels

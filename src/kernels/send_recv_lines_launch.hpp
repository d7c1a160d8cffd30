// Send/recv pairs in LL128 lines (send_recv_lines.cu): the arguments of the kernel (plain data, passed by value)
// and the layout of the communicator's area for them.
//
// A pair's messages carry their own flags, so a small send/recv is one launch with no signal on the path: the
// sender stores the message into its slot of the receiver's area as LL128 lines (ll128.cuh) whose flag is the
// pair's sequence (the messages this sender has sent that receiver in lines so far, plus one), and the receiver
// polls its slot until every line carries the sequence it expects (the messages it has received from that sender
// in lines so far, plus one). Both counts live in device memory and only the kernel advances them, so graph
// replays advance them too, and every flag is new within the pair: a line of an earlier message, or never written
// (the area starts zeroed), never carries a later message's flag. The k-th message in lines of a pair meets the
// k-th receive in lines of the other side, as FIFO pairs do.
//
// Slots go by the sequence's parity. A sender writes parity p again with message n + 2 only after the receiver
// has consumed message n: the receiver then stores n into the sender's `consumed` entry for it, and the sender
// waits for that before its first store (normally long done). Group 0 of a message (4 lines) carries its byte
// count in the first 8 bytes, which the receiver compares with its own: a message of another size is refused
// (nothing written, kErrorSizeMismatch recorded) and consumed all the same, so the pair stays in step.
//
// Where LL128 may run (lines that land whole): ll128.cuh. The selection table gives a pair lines by its bytes,
// as it gives large pairs the copy engines; each side asks with its own bytes, so sides whose sizes lie on
// different sides of the cut-off do not meet (the receiver's wait times out).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "kernels/ll128_launch.hpp"
#include "core/limits.hpp"

namespace braid::kernels {

// Payload of one message in lines, at most; larger pairs take the FIFOs (the selection table's row is lower).
constexpr size_t kSendRecvLinesMaxPayload = size_t(256) << 10;
constexpr size_t kSendRecvLinesGroups = 1 + (kSendRecvLinesMaxPayload + kLL128WarpPayload - 1) / kLL128WarpPayload;
constexpr size_t kSendRecvLinesSlotBytes = kSendRecvLinesGroups * kLL128WarpWire;
constexpr int kSendRecvLinesMaxPeers = kMaxWorld;

// One rank's area: the counts, then [parity 2][sender world] slots.
struct SendRecvLinesCounts {
  uint64_t sent[kSendRecvLinesMaxPeers];      // messages in lines this rank sent each peer (this rank's alone)
  uint64_t received[kSendRecvLinesMaxPeers];  // messages in lines this rank received from each peer (likewise)
  uint64_t consumed[kSendRecvLinesMaxPeers];  // [r]: this rank's messages that receiver r has consumed (r stores)
  // Blocks of the launch in flight that finished their part of the message to / from each peer: the last one
  // advances the count above (every block of the pair has read it by then) and re-arms this.
  unsigned int sends_finished[kSendRecvLinesMaxPeers];
  unsigned int receives_finished[kSendRecvLinesMaxPeers];
};
constexpr size_t kSendRecvLinesCountsBytes = (sizeof(SendRecvLinesCounts) + kLL128WarpWire - 1) / kLL128WarpWire * kLL128WarpWire;
constexpr size_t send_recv_lines_area_bytes(int world) {
  return kSendRecvLinesCountsBytes + 2 * static_cast<size_t>(world) * kSendRecvLinesSlotBytes;
}

// One direction of a pair: the peer and this rank's buffer and bytes, and the blocks that move it (each its share
// of the groups; the two sides may use different numbers).
struct SendRecvLinesPair {
  int peer;
  char* buffer;  // send: read only
  uint64_t bytes;
  int blocks;
};

// Groups of 4 lines a block's warps move in one round, and the blocks a message of `bytes` takes: one round each
// where it can, at most kSendRecvLinesMaxBlocks.
constexpr int kSendRecvLinesThreads = 512;
constexpr int kSendRecvLinesGroupsPerWarp = 4;
constexpr uint64_t kSendRecvLinesBlockGroups = uint64_t(kSendRecvLinesThreads / 32) * kSendRecvLinesGroupsPerWarp;
constexpr int kSendRecvLinesMaxBlocks = 8;
__host__ __device__ constexpr uint64_t send_recv_lines_groups(uint64_t bytes) { return 1 + (bytes + kLL128WarpPayload - 1) / kLL128WarpPayload; }
__host__ __device__ constexpr int send_recv_lines_blocks(uint64_t bytes) {
  const uint64_t blocks = (send_recv_lines_groups(bytes) + kSendRecvLinesBlockGroups - 1) / kSendRecvLinesBlockGroups;
  return blocks < uint64_t(kSendRecvLinesMaxBlocks) ? static_cast<int>(blocks) : kSendRecvLinesMaxBlocks;
}

// The sends' blocks first, in order, then the receives'.
struct SendRecvLinesLaunch {
  SendRecvLinesPair sends[kSendRecvLinesMaxPeers];
  SendRecvLinesPair recvs[kSendRecvLinesMaxPeers];
  int send_count;
  int recv_count;
  int blocks;  // in all
  char* area[kMaxWorld];  // every rank's area (collectives/peer_bases.hpp)
  device::SignalPad pad;
};

void launch_send_recv_lines(const SendRecvLinesLaunch& launch, cudaStream_t stream);

}  // namespace braid::kernels

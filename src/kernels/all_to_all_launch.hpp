// The arguments of the all-to-all kernels (plain data, passed by value). Sizes here are bytes: the kernels are
// datatype-blind, except that device-side counts arrive in elements and are scaled by element_bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>  // __host__ __device__

#include "braid/device/sync_device.hpp"
#include "kernels/pipeline_launch.hpp"
#include "kernels/staged_launch.hpp"
#include "memory/peer_range.hpp"

namespace braid::kernels {

// Every FIFO piece of an all-to-all starts with this header, so a receiver learns what its sender sends without
// knowing it beforehand (device counts) and can check what it expected (host counts).
struct alignas(16) AllToAllHeader {
  uint64_t pair_bytes;  // everything the sender sends this receiver in this call
  uint64_t reserved;
};
constexpr size_t kAllToAllHeaderBytes = sizeof(AllToAllHeader);

// How the pipelined all-to-all (all_to_all_pipelined.cu) cuts a pair's `bytes`, sent by `blocks` blocks through
// FIFO slots of `max_payload` bytes after the header, into pieces: the payload of a piece, in whole 16-byte
// vectors. At least kMinPairRounds rounds where the slots allow (in one round a sender pushes everything before
// its receiver copies any of it out: nothing overlaps); never more than a slot holds; never below
// kMinPiecePayload (a piece's post and wait cost the same whatever its size). Sender (from its count) and
// receiver (from round 0's header) compute it from the same bytes. Several rounds let a large pair's copy-out
// overlap its pushes; the floor keeps mid-size pairs from paying a post and a wait for many small pieces.
constexpr uint64_t kMinPairRounds = 4;
constexpr uint64_t kMinPiecePayload = 64 << 10;

__host__ __device__ constexpr uint64_t pair_piece_payload(uint64_t bytes, uint32_t blocks, uint64_t max_payload) {
  const uint64_t units = uint64_t(blocks) * kMinPairRounds;
  const uint64_t even = ((bytes + units - 1) / units + 15) / 16 * 16;
  const uint64_t wanted = even > kMinPiecePayload ? even : kMinPiecePayload;
  return wanted < max_payload ? wanted : max_payload / 16 * 16;
}

struct AllToAllLaunch {
  PipelineLaunch fifo;  // send, recv, area, piece_bytes, pad, collective (count and rank_stride unused)
  // Host counts (device_send_counts == nullptr): bytes and byte offsets per peer, carried by value.
  uint64_t send_bytes[kMaxWorld];
  uint64_t send_offset[kMaxWorld];
  uint64_t recv_bytes[kMaxWorld];
  uint64_t recv_offset[kMaxWorld];
  // Device counts: elements, read when the kernel starts; the received ones are written back.
  const int64_t* device_send_counts;
  const int64_t* device_send_displs;  // nullptr: packed in rank order
  int64_t* device_recv_counts;
  int64_t* device_recv_displs;        // nullptr: not asked for
  uint64_t recv_capacity;             // bytes recv holds (device counts)
  uint32_t element_bytes;
  // Peers (bit q: rank q) this launch pushes to and pulls from: every peer for all-to-all(v), the peers of a
  // batch for send_recv. A pair exchanges pieces only where the sender's send_peers and the receiver's
  // recv_peers agree; this rank's own block ignores both.
  unsigned int send_peers;
  unsigned int recv_peers;
  // A count mismatch is reported in bytes (kErrorSizeMismatch), not elements: send_recv's ops of one launch may
  // have different datatypes (element_bytes is then 1).
  bool mismatch_in_bytes;
  // send == recv (uniform all-to-all in place): a block copies a pair's piece of a round out of the FIFO only
  // after it pushed that piece of its own input to the peer, which the copy overwrites.
  bool in_place;
};

// Direct all-to-all on buffers peers have mapped: stores into every rank's recv (symmetric allocations,
// registered buffers), or loads from every rank's send (the one-sided all-to-all on global memory).
struct AllToAllDirectLaunch {
  PeerBuffers send;          // loads: every rank's send; stores: only [rank] is used
  PeerBuffers recv;          // stores: every rank's recv; loads: only [rank] is used
  size_t block_bytes;        // bytes each rank sends each rank
  bool loads;                // pull block rank() of every peer's send (else push this rank's blocks)
  unsigned int collective;
  device::SignalPad pad;
  uint64_t plan;  // collectives/plan.hpp: compared with every peer's at the barriers (0: not compared)
};

}  // namespace braid::kernels

// The arguments of the all-to-all kernels (plain data, passed by value). Sizes here are bytes: the kernels are
// datatype-blind, except that device-side counts arrive in elements and are scaled by element_bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "collectives/pipeline_launch.hpp"
#include "collectives/staged_launch.hpp"
#include "memory/peer_range.hpp"

namespace braid::kernels {

// Every FIFO piece of an all-to-all starts with this header, so a receiver learns what its sender sends without
// knowing it beforehand (device counts) and can check what it expected (host counts).
struct alignas(16) AllToAllHeader {
  uint64_t pair_bytes;  // everything the sender sends this receiver in this call
  uint64_t reserved;
};
constexpr size_t kAllToAllHeaderBytes = sizeof(AllToAllHeader);

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
};

// Direct all-to-all on buffers every peer has mapped (symmetric allocations, registered buffers).
struct AllToAllDirectLaunch {
  const char* send;          // this rank's send
  PeerBuffers recv_peers;    // every rank's recv
  size_t block_bytes;        // bytes each rank sends each rank
  unsigned int collective;
  device::SignalPad pad;
};

}  // namespace braid::kernels

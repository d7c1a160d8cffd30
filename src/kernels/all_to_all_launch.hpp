// The all-to-all kernels' arguments. Sizes are bytes; device counts are elements.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "braid/device/sync_device.hpp"
#include "kernels/pipeline_launch.hpp"
#include "kernels/staged_launch.hpp"
#include "memory/peer_range.hpp"

namespace braid::kernels {

struct alignas(16) AllToAllHeader {
  uint64_t pair_bytes;  // all the sender sends the receiver in this call
  uint64_t reserved;
};
constexpr size_t kAllToAllHeaderBytes = sizeof(AllToAllHeader);

// A piece's payload (whole vectors): kMinPairRounds rounds so copy-out overlaps pushes, but at least
// kMinPiecePayload (a piece's post and wait cost the same whatever its size) and at most a slot. Sender and
// receiver compute it from the same bytes.
constexpr uint64_t kMinPairRounds = 4;
constexpr uint64_t kMinPiecePayload = 64 << 10;

__host__ __device__ constexpr uint64_t pair_piece_payload(uint64_t bytes, uint32_t blocks, uint64_t max_payload) {
  const uint64_t units = uint64_t(blocks) * kMinPairRounds;
  const uint64_t even = ((bytes + units - 1) / units + 15) / 16 * 16;
  const uint64_t wanted = even > kMinPiecePayload ? even : kMinPiecePayload;
  return wanted < max_payload ? wanted : max_payload / 16 * 16;
}

struct AllToAllLaunch {
  PipelineLaunch fifo;  // count and rank_stride unused
  // Host counts (device_send_counts null), in bytes.
  uint64_t send_bytes[kMaxWorld];
  uint64_t send_offset[kMaxWorld];
  uint64_t recv_bytes[kMaxWorld];
  uint64_t recv_offset[kMaxWorld];
  // Device counts, read at kernel start; the received ones are written back.
  const int64_t* device_send_counts;
  const int64_t* device_send_displs;  // nullptr: packed in rank order
  int64_t* device_recv_counts;
  int64_t* device_recv_displs;        // nullptr: not asked for
  uint64_t recv_capacity;             // bytes
  uint32_t element_bytes;
  // Peer masks (send_recv: a batch's peers); both sides of a pair must agree. The own block ignores them.
  unsigned int send_peers;
  unsigned int recv_peers;
  bool mismatch_in_bytes;  // kErrorSizeMismatch: send_recv may mix datatypes
  bool in_place;           // send == recv (uniform sizes)
};

struct AllToAllDirectLaunch {
  PeerBuffers send;          // stores: only [rank] used
  PeerBuffers recv;          // loads: only [rank] used
  size_t block_bytes;        // each rank sends each rank
  bool loads;                // pull from every peer's send, else push
  unsigned int collective;
  device::SignalPad pad;
  uint64_t plan;             // 0: not compared
};

}  // namespace braid::kernels

// The arguments of the zero-copy collective kernels (plain data, passed by value): user buffers that every
// peer has mapped here (symmetric allocations, registered buffers), so kernels read and write them in place,
// with no staging copy. The peers' addresses travel in the launch itself (a snapshot per launch).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "memory/peer_range.hpp"

namespace braid::kernels {

struct ZeroCopyLaunch {
  PeerBuffers send;         // every rank's send buffer (16-byte aligned); all-gather: unused
  PeerBuffers recv_peers;   // every rank's recv buffer (two shot and all-gather write them); reduce-scatter: unused
  const char* local_send;   // this rank's send (all-gather: peers need not map it)
  char* recv;               // this rank's recv
  size_t count;             // elements (all-gather: bytes of one rank's block)
  size_t rank_stride;       // bytes between rank blocks (reduce-scatter's send, all-gather's recv; a multiple of 16)
  unsigned int collective;
  device::SignalPad pad;
  uint64_t plan;  // collectives/plan.hpp: compared with every peer's at the barriers (0: not compared)
};

}  // namespace braid::kernels

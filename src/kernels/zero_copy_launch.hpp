// Arguments of the zero-copy kernels (plain data, by value): user buffers every peer maps, used in place.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "memory/peer_range.hpp"

namespace braid::kernels {

struct ZeroCopyLaunch {
  PeerBuffers send;         // 16-byte aligned
  PeerBuffers recv_peers;
  const char* local_send;   // all-gather: peers need not map it
  char* recv;
  size_t count;             // elements (all-gather: bytes of one rank's block)
  size_t rank_stride;       // bytes between rank blocks (a multiple of 16)
  unsigned int collective;
  device::SignalPad pad;
  uint64_t plan;  // 0: not compared
};

}  // namespace braid::kernels

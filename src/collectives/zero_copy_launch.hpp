// The arguments of the zero-copy collective kernels (plain data, passed by value): user buffers that live in
// a symmetric allocation of the communicator, so every peer's copy is mapped here and kernels read and write
// it in place, with no staging copy. Every rank passes its own copy at the same offset.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"

namespace braid::kernels {

struct ZeroCopyLaunch {
  char* const* send_peers;  // device array [world]: every rank's copy of the send buffer's allocation
  size_t send_offset;       // bytes from the allocation's start to the send buffer (16-byte aligned)
  char* const* recv_peers;  // the same for recv; nullptr when only this rank's recv is written (one shot)
  size_t recv_offset;
  char* recv;               // this rank's recv
  size_t count;             // elements
  unsigned int collective;
  device::SignalPad pad;
};

}  // namespace braid::kernels

// The arguments of every staged collective kernel (plain data, by value).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "core/limits.hpp"

namespace braid::kernels {

using braid::kMaxWorld;

struct StagedLaunch {
  const char* send;
  char* recv;
  size_t count;        // elements (see each kernel)
  size_t rank_stride;  // elements between ranks' blocks of a user buffer
  int root;
  unsigned int collective;
  char* const* staging;  // device array [world]
  size_t half_bytes;
  device::SignalPad pad;
  uint64_t* epoch;
  unsigned int* blocks_done;
  uint64_t plan;  // 0: not compared
};

}  // namespace braid::kernels

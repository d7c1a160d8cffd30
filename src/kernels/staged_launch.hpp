// The arguments of every staged collective kernel (plain data, passed by value; host and device see it alike).
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
  size_t count;        // elements this launch moves (per-collective meaning; see each kernel)
  size_t rank_stride;  // elements between consecutive ranks' blocks in a user buffer (all-gather, reduce-scatter)
  int root;
  unsigned int collective;
  char* const* staging;  // device array [world]: every rank's staging buffer (both halves)
  size_t half_bytes;     // bytes of one staging half
  device::SignalPad pad;
  uint64_t* epoch;
  unsigned int* blocks_done;
  uint64_t plan;  // collectives/plan.hpp: compared with every peer's at the barriers (0: not compared)
};

}  // namespace braid::kernels

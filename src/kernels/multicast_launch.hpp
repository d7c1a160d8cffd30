// Multicast kernel arguments (plain data, by value) and the calls they serve (memory/multicast.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/multimem_device.hpp"
#include "braid/device/sync_device.hpp"
#include "braid/types.hpp"
#include "kernels/collective_id.hpp"

namespace braid::kernels {

struct MulticastLaunch {
  const char* send;
  char* recv;
  size_t count;        // elements; all-gather: bytes of a rank's block
  size_t rank_stride;  // all-gather: bytes between ranks' blocks of recv
  int root;
  unsigned int collective;
  char* local;      // this rank's copy of the region
  char* multicast;
  size_t half_bytes;
  device::SignalPad pad;
  uint64_t* epoch;
  unsigned int* blocks_done;
  uint64_t plan;  // 0: not compared
};

// Decided by what every rank passes alike, so every rank agrees.
inline bool multicast_serves(Collective collective, DataType type, ReduceOp op, size_t bytes) {
  if (bytes == 0 || bytes % 16 != 0) return false;
  if (collective == Collective::kAllGather) return true;
  if (collective != Collective::kAllReduce && collective != Collective::kReduce) return false;
  return device::multimem_reduces(type, op);
}

}  // namespace braid::kernels

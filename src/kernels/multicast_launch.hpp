// The arguments of the multicast collective kernels (plain data, passed by value), and which calls they serve.
// The data moves through the communicator's multicast region (memory/multicast.hpp): each rank's copy is
// bound to one multicast object, so a multimem access at the multicast address reaches every rank's copy at
// the same offset. Halves alternate by the region's own epoch, as the staged kernels' halves do (staged.cuh
// says why no half is rewritten while a peer still reads it).
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
  size_t count;        // elements this launch reduces (all-reduce, reduce); bytes of each rank's block (all-gather)
  size_t rank_stride;  // all-gather: bytes between consecutive ranks' blocks of recv
  int root;
  unsigned int collective;
  char* local;      // this rank's copy of the region (both halves)
  char* multicast;  // the region's multicast address
  size_t half_bytes;
  device::SignalPad pad;
  uint64_t* epoch;
  unsigned int* blocks_done;
  uint64_t plan;  // collectives/plan.hpp: compared with every peer's at the barriers (0: not compared)
};

// Whether the multicast kernels serve a call: all-reduce and reduce of the (type, op) pairs multimem.ld_reduce
// does (device::multimem_reduces: float32 sums, float16 and bfloat16 sums, minima and maxima), all-gather of
// any type; in whole 16-byte vectors (multimem accesses move vectors only). Other calls take the unicast
// algorithms. Only what every rank passes alike decides (not the buffers' addresses), so every rank makes the same choice.
inline bool multicast_serves(Collective collective, DataType type, ReduceOp op, size_t bytes) {
  if (bytes == 0 || bytes % 16 != 0) return false;
  if (collective == Collective::kAllGather) return true;
  if (collective != Collective::kAllReduce && collective != Collective::kReduce) return false;
  return device::multimem_reduces(type, op);
}

}  // namespace braid::kernels

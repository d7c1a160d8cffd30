// What the CUDA backend's collectives need of a communicator: the memory layer's part (who this rank is, the
// buffers every peer maps), the order of its calls, the signal pad, and the symmetric buffers made at init that
// carry data between GPUs. The communicator's state is one (comm/comm_state.hpp); collectives take this part
// only.
#pragma once

#include <memory>
#include <string>

#include "braid/types.hpp"
#include "collectives/selection.hpp"  // kMaxBlocks
#include "core/side_stream.hpp"
#include "memory/memory_context.hpp"
#include "memory/multicast.hpp"
#include "memory/symmetric_memory.hpp"
#include "sync/call_order.hpp"
#include "sync/device_sync.hpp"

namespace braid::collectives {

struct CollectiveContext : detail::MemoryContext {
  // Orders the communicator's calls whatever stream each names (sync/call_order.hpp); both backends.
  std::unique_ptr<detail::CallOrder> order;
  std::string algorithm_override;  // CommOptions::algorithms, else BRAID_ALGO; read once
  int max_blocks = kMaxBlocks;     // CommOptions::max_blocks, else BRAID_MAX_BLOCKS, else kMaxBlocks; read once
  int ranks_per_gpu = 1;           // the most ranks on one GPU (BRAID_ALLOW_SHARED_GPU=1), which share its SMs

  // Made at init on the CUDA backend (collectives never allocate), null or empty on the NCCL backend: the
  // signal pad, and the symmetric buffers that carry collectives on buffers peers cannot map: staging halves
  // (staged kernels), the pipeline FIFOs (pipelined kernels) and the LL area (flag-in-data lines). Each protocol
  // keeps its own buffer, so one protocol's reuse rule never has to reason about another's.
  std::unique_ptr<DeviceSync> sync;
  SymmetricMemory staging;
  SymmetricMemory pipeline;
  SymmetricMemory ll;
  SymmetricMemory ll128;
  // Send/recv pairs in LL128 lines (send_recv_lines_launch.hpp): made only where ll128_lines holds.
  SymmetricMemory send_recv_lines;
  // The second stream of the copy-engine collectives (collectives/copy_engine.hpp): this rank's own block runs
  // there beside the caller's stream.
  std::unique_ptr<SideStream> side;
  // A third stream: the copy-engine send/recv's sender kernels run there beside its copies on the caller's stream
  // (send_recv_bulk_launch.hpp), while its receives run on `side`.
  std::unique_ptr<SideStream> second_side;
  // A fourth: the own block of a collective whose pairs move as send/recv's copy-engine chunks
  // (copy_engine_pairs.hpp) is copied there, beside the other three.
  std::unique_ptr<SideStream> third_side;
  // NVLink multicast (all-reduce, reduce, all-gather): only where BRAID_ENABLE_MULTICAST=1 and every rank could
  // set it up (memory/multicast.hpp); null otherwise, and the collectives run unicast.
  std::unique_ptr<detail::MulticastRegion> multicast;
  // Whether LL128 may run: every pair of GPUs reports native P2P atomics, which NVLink gives and PCIe peers in
  // general do not, and NVLink delivers a warp's 128-byte line whole (all_reduce_ll128.cu). Agreed at init.
  bool ll128_lines = false;
};

// The ordering scope of one call that enqueues work on `stream`: every such call holds one while it enqueues
// (after its arguments are checked), with the communicator's GPU current.
inline detail::CallOrder::Scope ordered(CollectiveContext& context, Stream stream) {
  return detail::CallOrder::Scope(*context.order, context.device, stream);
}

}  // namespace braid::collectives

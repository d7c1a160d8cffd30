// What the CUDA backend's collectives work on: its state, made at init from the communicator's memory context.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "bootstrap/host_mailbox.hpp"
#include "braid/types.hpp"
#include "collectives/selection.hpp"  // kMaxBlocks
#include "core/error.hpp"
#include "core/private_copy.hpp"
#include "core/side_stream.hpp"
#include "memory/memory_context.hpp"
#include "memory/multicast.hpp"
#include "memory/registered_exposures.hpp"
#include "memory/symmetric_memory.hpp"
#include "sync/call_order.hpp"
#include "sync/device_sync.hpp"

namespace braid::collectives {

// What every rank agreed on at init that decides how the calls run.
struct CallSettings {
  std::string algorithm_override;  // CommOptions::algorithms, else BRAID_ALGO; read once
  int max_blocks = kMaxBlocks;     // CommOptions::max_blocks, else BRAID_MAX_BLOCKS; read once
  int ranks_per_gpu = 1;           // the most ranks sharing one GPU's SMs (BRAID_ALLOW_SHARED_GPU=1)
  int threads_per_gpu = 1;         // the most of those in one process, sharing the GPU's context
  // Every GPU pair reports native P2P atomics (NVLink, not PCIe in general) and delivers a warp's 128-byte line
  // whole (all_reduce_ll128.cu).
  bool ll128_lines = false;
  bool eager_zero_copy = false;  // BRAID_EAGER_ZERO_COPY: eager all-gathers, reduce-scatters and all-reduces announce their buffers (announced_launch.hpp)
};

// The CUDA backend's state (backends/cuda/cuda_backend.hpp owns it): the communicator's memory context and call
// order it was made from, the settings, and what it made at init (collectives never allocate). Each protocol
// keeps its own area, so no reuse rule reasons about another's.
struct CollectiveContext {
  CollectiveContext(detail::MemoryContext& memory, detail::CallOrder& order, const CallSettings& settings)
      : memory(memory), order(order), rank(memory.rank), size(memory.size), device(memory.device),
        algorithm_override(settings.algorithm_override), max_blocks(settings.max_blocks),
        ranks_per_gpu(settings.ranks_per_gpu), threads_per_gpu(settings.threads_per_gpu),
        ll128_lines(settings.ll128_lines),
        eager_zero_copy(settings.eager_zero_copy) {}
  CollectiveContext(const CollectiveContext&) = delete;
  CollectiveContext& operator=(const CollectiveContext&) = delete;

  detail::MemoryContext& memory;  // the communicator's: buffers peers map, registrations, bootstrap
  detail::CallOrder& order;       // orders the calls whatever stream each names
  const int rank, size, device;   // memory's
  const std::string algorithm_override;
  const int max_blocks;
  const int ranks_per_gpu;
  const int threads_per_gpu;
  const bool ll128_lines;
  const bool eager_zero_copy;

  std::unique_ptr<DeviceSync> sync;
  SymmetricMemory staging;
  SymmetricMemory pipeline;
  SymmetricMemory ll;
  SymmetricMemory ll128;
  SymmetricMemory send_recv_lines;  // send/recv pairs in LL128 lines; made only where ll128_lines holds
  // The own block (copy_engine.hpp), send/recv's receives, or the in-place all-to-all's pushes.
  std::unique_ptr<SideStream> side;
  // Copy-engine send/recv's sender kernels, or the in-place all-to-all's copies out of its slots.
  std::unique_ptr<SideStream> second_side;
  // The own block beside copy-engine pairs (copy_engine_pairs.hpp).
  std::unique_ptr<SideStream> third_side;
  // The barrier that agrees on a buffer exchange (call_buffers.cpp), made once at init: a stream made per call
  // could wait for the whole device (NOTE [streams made before the exchanges]).
  std::unique_ptr<detail::PrivateStream> exchange_stream;
  // Null unless BRAID_ENABLE_MULTICAST=1 and every rank could set it up.
  std::unique_ptr<detail::MulticastRegion> multicast;
  // Where announcing kernels tell the peers where their buffers lie; made only where eager_zero_copy holds.
  SymmetricMemory announcements;
  // The ranges this rank exposed to its peers and theirs mapped here (null on one rank and without
  // eager_zero_copy). Last: its helper stops
  // before anything it reads goes. Shared: registrations' removal hooks hold it weakly.
  std::shared_ptr<detail::RegisteredExposures> exposures;
  // Gathers the announcements of large eager calls on the host (NOTE [exchanged exposures], call_buffers.cpp): a
  // mailbox in shared memory, advanced only by the communicator's calls. Null unless exposures is set and every
  // rank is a process of its own (peers in this process are served by kernels, not the engines).
  std::unique_ptr<HostMailbox> exposure_exchange;
};

// Where ranks share a GPU as threads of one process (threads_per_gpu > 1, the most on any GPU, so every rank
// alike), they refuse the legacy default stream: they share the GPU's context and so its legacy stream, where one
// rank's kernel would wait for a peer's queued behind it, forever. Ranks that are processes of their own each have
// their own context and legacy stream, which they may use. `function` names the call in the error.
inline void refuse_shared_legacy_stream(const char* function, int threads_per_gpu, Stream stream) {
  if (threads_per_gpu > 1 && (stream == nullptr || stream == cudaStreamLegacy)) {
    raise_invalid_argument(function, "stream",
                           "is the legacy default stream, which ranks sharing a GPU as threads of one process "
                           "(BRAID_ALLOW_SHARED_GPU=1) share: their calls would wait on each other there; pass a "
                           "stream of the rank's own (or cudaStreamPerThread)");
  }
}

// The ordering scope a call holds while it enqueues (after its checks, the legacy-stream refusal among them), with
// its GPU current.
inline detail::CallOrder::Scope ordered(CollectiveContext& context, Stream stream) {
  return detail::CallOrder::Scope(context.order, context.device, stream);
}

}  // namespace braid::collectives

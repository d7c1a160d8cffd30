// The CUDA backend: braid's own kernels over symmetric memory, for ranks that are GPUs of one host with P2P
// access to each other. It owns its state (collectives/collective_context.hpp): the signal pad, the staging,
// pipeline, LL and LL128 areas, send/recv's lines, the side streams and the multicast region, made when it is
// created; every call goes to the collectives layer (collectives/collectives.hpp) with that state.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cuda/peer_watch.hpp"
#include "braid/memory.hpp"
#include "collectives/collective_context.hpp"
#include "memory/memory_context.hpp"
#include "memory/multicast.hpp"
#include "sync/call_order.hpp"

namespace braid::detail {

// What the communicator gives the CUDA backend to make its state from; the memory context and the call order
// outlive the backend.
struct CudaBackendSetup {
  std::shared_ptr<MemoryContext> memory;
  CallOrder* order = nullptr;
  collectives::CallSettings settings;
  std::vector<int> peer_pids;  // [world]: a rank's pid where this rank can watch it (PeerWatch), else 0
  std::function<SymmetricMemory(size_t bytes)> allocate;  // a symmetric allocation on every rank, together
  MulticastTeam multicast;
  // Store clients of the exposure helper's own, and the communicator's namespace in the store.
  std::function<std::unique_ptr<StoreClient>()> connect;
  std::string store_prefix;
};

class CudaBackend final : public Backend {
 public:
  // Collective: every rank creates its backend together (the areas are symmetric allocations). Bad sizes in
  // BRAID_STAGING_BYTES, BRAID_PIPELINE_BYTES or BRAID_MULTICAST_BYTES: kInvalidArgument naming the variable.
  explicit CudaBackend(const CudaBackendSetup& setup);

  const char* name() const override { return "cuda"; }
  void collective(const collectives::CollectiveCall& call, Stream stream) override;
  void all_to_allv(const collectives::AllToAllvCall& call, Stream stream) override;
  void send_recv(const collectives::PointToPointBatch& batch, Stream stream) override;
  void raise_recorded_failure() override;
  void check() override;
  void abort() noexcept override;
  void revoke() override;

  collectives::CollectiveContext& context() { return context_; }

 private:
  // Ends this rank's host waits (store, fd passing, the exposure exchange) with the recorded fatal failure, from the
  // peer watch's thread or revoke()'s caller. Never throws.
  void end_host_waits() noexcept;

  collectives::CollectiveContext context_;
  std::unique_ptr<PeerWatch> peer_watch_;  // after context_: stops before the signal pad goes
};

}  // namespace braid::detail

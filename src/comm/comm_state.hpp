// What a communicator holds on each rank. Shared (std::shared_ptr) by the Communicator handle and by every
// symmetric allocation made from it, so teardown works in any order. Each layer below takes its own part: the
// memory layer a MemoryContext, the collectives a CollectiveContext (collectives/collective_context.hpp); the
// calls run on the backend chosen at init.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/nccl/nccl_backend.hpp"
#include "bootstrap/store.hpp"
#include "braid/braid.hpp"
#include "collectives/collective_context.hpp"

namespace braid::detail {

struct CommState : collectives::CollectiveContext {
  std::shared_ptr<StoreServer> store_server;  // held by the rank that serves the store
  std::shared_ptr<StoreClient> store;
  std::vector<PeerInfo> peers;

  // What runs the calls: the CUDA backend on this state's collective context, or NCCL (chosen once at init).
  std::unique_ptr<Backend> backend;
  // The NCCL communicator of the NCCL backend (null on the CUDA backend): nothing of the collective context
  // beyond the memory layer's part is made then. Shared so that registrations' deregistration hook can hold it
  // weakly.
  std::shared_ptr<NcclBackend> nccl;
};

// The state behind a Communicator handle; a moved-from handle is refused naming the call.
CommState& usable(const std::shared_ptr<CommState>& state, const char* function);

// The entry of a call that enqueues work: the state (refusing a moved-from one), this rank set for logging, and
// a fatal failure an earlier call recorded raised before anything of this call is enqueued.
CommState& enter(const std::shared_ptr<CommState>& state, const char* function);

// Where the calls of `state` run, for the argument checks.
inline collectives::CallPlace place_of(const CommState& state) { return {state.rank, state.size, state.device}; }

// Refuses (kUnsupported, naming `function`) what only the CUDA backend serves, on an NCCL-backend communicator.
void require_cuda_backend(const CommState& state, const char* function);

}  // namespace braid::detail

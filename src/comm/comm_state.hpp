// What a communicator holds on each rank: its memory context (the base: rank, GPU, bootstrap, the buffers peers
// map), the store, the peers, the call order and settings, and the backend chosen at init, which owns whatever
// state it needs. Shared (std::shared_ptr) by the Communicator handle and by what must outlive a handle (a
// MoeBuffer), so teardown works in any order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cuda/cuda_backend.hpp"
#include "backends/nccl/nccl_backend.hpp"
#include "bootstrap/store.hpp"
#include "braid/braid.hpp"
#include "collectives/collective_context.hpp"

namespace braid::detail {

struct CommState : MemoryContext {
  std::shared_ptr<StoreServer> store_server;  // held by the rank that serves the store
  std::shared_ptr<StoreClient> store;
  std::vector<PeerInfo> peers;
  Rendezvous rendezvous;  // as init got it, with job_id this communicator's own namespace (shrink's parent)
  CommOptions options;    // as init got them, with the device it chose (shrink's children inherit them)
  int shrinks = 0;        // shrink() calls so far: every survivor counts alike
  std::unique_ptr<CallOrder> order;  // orders the calls whatever stream each names; both backends
  collectives::CallSettings settings;

  // What runs the calls (chosen once at init): the CUDA backend, or NCCL.
  std::unique_ptr<Backend> backend;
  CudaBackend* cuda = nullptr;  // `backend` where it is the CUDA backend; see cuda_context
  // The NCCL communicator of the NCCL backend (null on the CUDA backend). Shared so that registrations'
  // deregistration hook can hold it weakly.
  std::shared_ptr<NcclBackend> nccl;
};

// The state behind a Communicator handle; a moved-from handle is refused naming the call.
CommState& usable(const std::shared_ptr<CommState>& state, const char* function);

// The entry of a call that enqueues work: the state (refusing a moved-from one), this rank set for logging, and
// a fatal failure an earlier call recorded raised before anything of this call is enqueued.
CommState& enter(const std::shared_ptr<CommState>& state, const char* function);
// The same for a call that takes a stream: then, where ranks share a GPU as threads, the legacy stream is refused
// (collectives::refuse_shared_legacy_stream), whatever the call's sizes.
CommState& enter(const std::shared_ptr<CommState>& state, const char* function, Stream stream);

// Where the calls of `state` run, for the argument checks.
inline collectives::CallPlace place_of(const CommState& state) { return {state.rank, state.size, state.device}; }

// Refuses (kUnsupported, naming `function`) what only the CUDA backend serves, on an NCCL-backend communicator.
void require_cuda_backend(const CommState& state, const char* function);
// The CUDA backend's state, the one way to it: require_cuda_backend first.
collectives::CollectiveContext& cuda_context(CommState& state, const char* function);

// The ordering scope a call on `state` holds while it enqueues (after enter() and its checks), its GPU current.
inline CallOrder::Scope ordered(CommState& state, Stream stream) {
  return CallOrder::Scope(*state.order, state.device, stream);
}

}  // namespace braid::detail

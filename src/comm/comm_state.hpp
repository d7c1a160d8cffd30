// What a communicator holds on each rank. Shared (std::shared_ptr) by the Communicator handle and by every
// symmetric allocation made from it, so teardown works in any order.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/fd_passing.hpp"
#include "bootstrap/store.hpp"
#include "backends/nccl/nccl_backend.hpp"
#include "braid/braid.hpp"
#include "core/side_stream.hpp"
#include "memory/multicast.hpp"
#include "memory/registration.hpp"
#include "sync/call_order.hpp"
#include "sync/device_sync.hpp"

namespace braid::detail {

struct SymmetricAllocation;

struct CommState {
  int rank = -1;
  int size = 0;
  int device = -1;
  double timeout_s = 0;
  std::string uid;                            // unique per communicator; names host-local sockets
  std::shared_ptr<StoreServer> store_server;  // held by the rank that serves the store
  std::shared_ptr<StoreClient> store;
  std::unique_ptr<Bootstrap> bootstrap;
  std::unique_ptr<FdExchanger> fds;
  std::vector<PeerInfo> peers;

  // Orders the communicator's calls whatever stream each names (sync/call_order.hpp); both backends.
  std::unique_ptr<CallOrder> order;

  // The NCCL backend (BRAID_BACKEND=nccl, or auto where the CUDA backend cannot serve the ranks): collectives
  // run on it, and nothing below (signal pad, staging, symmetric memory) is made. Shared so that registrations'
  // deregistration hook can hold it weakly.
  std::shared_ptr<NcclBackend> nccl;

  // Made at init (collectives never allocate): the signal pad, and the symmetric buffers that carry
  // collectives on buffers peers cannot map: staging halves (staged kernels), the pipeline FIFOs (pipelined
  // kernels) and the LL area (flag-in-data lines). Each protocol keeps its own buffer, so one protocol's reuse
  // rule never has to reason about another's.
  std::unique_ptr<DeviceSync> sync;
  SymmetricMemory staging;
  SymmetricMemory pipeline;
  SymmetricMemory ll;
  // The second stream of the copy-engine collectives (collectives/copy_engine.hpp): this rank's own block, and
  // every other chunk of the pulls, run there beside the caller's stream.
  std::unique_ptr<SideStream> side;
  // NVLink multicast (all-reduce, reduce, all-gather): only where BRAID_ENABLE_MULTICAST=1 and every rank could
  // set it up (memory/multicast.hpp); null otherwise, and the collectives run unicast.
  std::unique_ptr<MulticastRegion> multicast;
  std::string algorithm_override;  // CommOptions::algorithms, else BRAID_ALGO; read once

  // Every symmetric allocation made from this communicator (its own buffers and users'), so a collective can
  // tell a buffer peers have mapped (zero copy) from one they have not (staging). Weak: an allocation lives
  // as long as its handles, not as long as the communicator. See find_symmetric_range.
  std::mutex symmetric_mutex;
  std::vector<std::weak_ptr<SymmetricAllocation>> symmetric_allocations;

  // Buffers users registered (register_buffer) and the peers' mappings their first uses made. Registrations
  // hold it weakly: deregistering after the communicator is gone is a no-op.
  std::shared_ptr<RegistrationCache> registrations = std::make_shared<RegistrationCache>();

  std::mutex setup_mutex;       // serialises this rank's collective setup calls (alloc, barrier)
  uint64_t alloc_sequence = 0;  // tags fd exchanges; collective calls keep it equal on every rank
};

// The state behind a Communicator handle; a moved-from handle is refused naming the call.
CommState& usable(const std::shared_ptr<CommState>& state, const char* function);

// The ordering scope of one call that enqueues work on `stream`: every such call holds one while it enqueues
// (after its arguments are checked), with the communicator's GPU current.
inline CallOrder::Scope ordered(CommState& state, Stream stream) { return CallOrder::Scope(*state.order, state.device, stream); }

// Refuses (kUnsupported, naming `function`) what only the CUDA backend serves, on an NCCL-backend communicator.
void require_cuda_backend(const CommState& state, const char* function);

}  // namespace braid::detail

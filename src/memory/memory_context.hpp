// What the memory layer needs of a communicator: who this rank is, the host channels that exchange memory
// handles (bootstrap, fd passing), and the registries of the memory its collectives may find mapped by every peer
// (symmetric allocations, registered buffers). The communicator's state is one (comm/comm_state.hpp); memory
// functions take this part only.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/fd_passing.hpp"
#include "core/error.hpp"
#include "core/private_copy.hpp"
#include "memory/registration.hpp"

namespace braid::detail {

struct SymmetricAllocation;

struct MemoryContext {
  int rank = -1;
  int size = 0;
  int device = -1;
  double timeout_s = 0;
  std::string uid;  // unique per communicator; names host-local sockets
  std::unique_ptr<Bootstrap> bootstrap;
  std::unique_ptr<FdExchanger> fds;
  // The stream of this rank's set-up fills and uploads, made at the start of init (NOTE [streams made before the
  // exchanges]); null only in a context no init made.
  std::unique_ptr<PrivateStream> setup_stream;

  // Every symmetric allocation made from this communicator (its own buffers and users'), so a collective can
  // tell a buffer peers have mapped (zero copy) from one they have not (staging). Weak: an allocation lives
  // as long as its handles, not as long as the communicator. See find_symmetric_range.
  std::mutex symmetric_mutex;
  std::vector<std::weak_ptr<SymmetricAllocation>> symmetric_allocations;

  // Buffers users registered (register_buffer) and the peers' mappings their first uses made. Registrations
  // hold it weakly: deregistering after the communicator is gone is a no-op.
  std::shared_ptr<RegistrationCache> registrations = std::make_shared<RegistrationCache>();

  std::mutex setup_mutex;       // serialises this rank's collective setup calls (alloc, barrier, exchanges)
  uint64_t alloc_sequence = 0;  // tags fd exchanges; collective calls keep it equal on every rank

  // setup_stream's handle; kInternal where init made none.
  cudaStream_t setup() const {
    if (setup_stream == nullptr) {
      raise(ErrorCode::kInternal, "rank {}: no set-up stream (a context no init made)", rank);
    }
    return setup_stream->get();
  }
};

}  // namespace braid::detail

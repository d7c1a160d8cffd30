// ncclUniqueId as the shim makes it: where braid's rendezvous store listens. ncclGetUniqueId starts a store in the
// calling process (as NCCL starts its bootstrap root there) and writes its address into the id's 128 bytes; every
// rank's ncclCommInitRank meets the others there.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "braid/braid.hpp"

namespace braid::shim {

struct StoreAddress {
  std::string dial;  // "host:port" this process should dial
  uint64_t nonce;    // random per id: names the job's host-local sockets (Rendezvous::job_id)
};

// Starts a store (bound to every interface, or to 127.0.0.1 where the host has no non-loopback IPv4 address) and
// describes it in an id: its port, the host's first non-loopback IPv4 address (loopback where there is none) and
// boot id (ranks on the same boot dial loopback), and a nonce. The store lives until the first communicator made from the id in this process takes it (claim_store), then as
// long as the communicators holding it.
ncclUniqueId make_unique_id();

// The store an id names, or nullopt for an id the shim did not make (a real NCCL id).
std::optional<StoreAddress> read_unique_id(const ncclUniqueId& id);

// The store this process serves for the id (null where another process serves it). Every communicator of this
// process made from the id should hold the result until destroyed.
std::shared_ptr<StoreHost> claim_store(uint64_t nonce);

}  // namespace braid::shim

// What an exported handle keeps alive, and the exchange of every rank's export behind
// Communicator::import_global (export_import.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memory/memory_handle.hpp"
#include "memory/shareable.hpp"
#include "memory/vmm.hpp"

namespace braid::detail {

struct MemoryContext;

// What an ExportedHandle keeps alive: the blob, and for VMM memory the descriptor importers take. While it lives,
// its blob is one of this process's exports (the only blobs naming this process that an import accepts).
struct ExportedRange {
  MemoryDescriptor descriptor;
  std::string blob;
  FdOwner fd;

  ~ExportedRange();
};

// Every rank's export, mapped here: [rank] its address in this process (this rank's own as exported) and its
// size; the mappings keep the peers' memory mapped.
struct ImportedPeers {
  std::vector<void*> peers;
  std::vector<size_t> bytes;
  std::vector<std::shared_ptr<PeerMapping>> mappings;
};

// NOTE [descriptors naming this process]
// A descriptor that names this process (its pid on this host) is used as it is: its address taken as the
// memory's, no IPC handle opened (PeerMapping::open). So a forged one could aim this process's kernels at any
// address, and anyone who can write a blob (a store client, a caller of import_handle) could hand one over. Such
// a descriptor is accepted only where this process itself put it in the hands of whoever passes it on:
// - import_handle: a blob of one of this process's live exports (export_handle, until its handle is gone);
// - from rank `peer` of a communicator's exchange (import_global, registered and automatic buffers): a blob that
//   rank `peer` of that communicator, a thread of this process, offered for its exchange (offer_to_thread_ranks),
//   never this rank's own. A rank's offer lasts until its next exchange on that communicator has been gathered
//   (every rank is then past this one) or its communicator is gone.
// Ranks that are other processes never name this process, so they are unaffected. unpack_for_import is the one
// place this is decided.

// The rank that handed over a blob in an exchange: `peer` of the communicator whose memory context is `context`.
struct BlobOrigin {
  const MemoryContext* context;
  int peer;
};

// The descriptor `blob` names (unpack(): this host, signed with the job secret where there is one), refused
// with kInvalidArgument naming `argument` where it names this process without leave (NOTE [descriptors naming
// this process]). `origin`: the peer that handed it over in an exchange; none for import_handle.
MemoryDescriptor unpack_for_import(const std::string& blob, const char* function, const char* argument,
                                   std::optional<BlobOrigin> origin = std::nullopt);

// This rank's blob in an exchange of `context`'s communicator, offered to the peers that are threads of this
// process; called before the exchange's allgather.
void offer_to_thread_ranks(const MemoryContext& context, const std::string& blob);
// Called after the exchange's allgather, with this exchange's blob ("" where it offered none): every rank is past
// this rank's earlier exchanges, so their offers are withdrawn.
void withdraw_earlier_offers(const MemoryContext& context, const std::string& current);

// A copy, in this process, of descriptor `fd` of process `pid` (pidfd_getfd, Linux 5.6+; needs ptrace permission
// over it), or of this process's own `fd` (dup).
int take_fd(uint32_t pid, int fd);

// Collective over the communicator's ranks: every rank passes its own export, and gets every peer's mapped.
// `function` names the call in errors about a peer's blob. A rank whose export was refused passes null and the
// reason in `refusal`: it still joins the exchange, so that every rank fails at once (this one kInvalidArgument
// naming mine, the others kMismatch naming it). This rank's fds go to the peers before their blobs are read, so a
// peer's bad blob fails this rank alone.
ImportedPeers import_every_rank(MemoryContext& context, const ExportedRange* mine, const std::string& refusal,
                                const char* function);

}  // namespace braid::detail

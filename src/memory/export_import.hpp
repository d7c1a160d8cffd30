// What an exported handle keeps alive, and the exchange of every rank's export behind
// Communicator::import_global (export_import.cpp).
#pragma once

#include <memory>
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

// Collective over the communicator's ranks: every rank passes its own export, and gets every peer's mapped.
// `function` names the call in errors about a peer's blob.
ImportedPeers import_every_rank(MemoryContext& context, const ExportedRange& mine, const char* function);

}  // namespace braid::detail

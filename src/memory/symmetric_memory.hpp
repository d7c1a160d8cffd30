// Symmetric allocations: the same size on every rank, made with cuMemCreate (POSIX-fd handles), exported,
// passed to every peer over Unix sockets, imported and mapped read/write for the local GPU.
#pragma once

#include <cuda.h>

#include <memory>
#include <optional>
#include <vector>

#include "braid/memory.hpp"
#include "memory/peer_range.hpp"

namespace braid {
namespace detail {

struct MemoryContext;

// One rank's side of a symmetric allocation. It needs nothing of the communicator after allocation, so it
// outlives it freely (teardown in any order) and the communicator may own allocations of its own. The destructor unmaps and releases everything this rank holds; the physical memory of a rank lives on
// until every peer has released its import, so a rank freeing early never pulls memory from under a peer's
// mapping (the driver reference-counts it).
struct SymmetricAllocation {
  int rank = -1;
  int world = 0;
  int device = -1;
  uint64_t sequence = 0;    // the communicator's collective setup count when it was made: the same on every rank
  size_t bytes = 0;         // as asked
  size_t mapped_bytes = 0;  // rounded up to the allocation granularity; the stride of the view
  std::vector<CUmemGenericAllocationHandle> handles;  // [world]: own and imported
  std::vector<CUdeviceptr> mappings;                  // [world]: where each rank's copy is mapped here
  CUdeviceptr view = 0;                               // contiguous view, or 0
  std::vector<void*> peer_pointers;                   // host copy of the table below
  void** device_peer_pointers = nullptr;              // device array [world]

  ~SymmetricAllocation();
};

}  // namespace detail

// Collective over the ranks of `comm`: validates `bytes` (> 0, equal on every rank), allocates, exchanges
// and maps. Every rank's memory is zeroed before any peer can see it.
std::shared_ptr<detail::SymmetricAllocation> allocate_symmetric(const std::shared_ptr<detail::MemoryContext>& comm,
                                                               size_t bytes, const AllocOptions& options);

// The symmetric allocation of `state` that holds [pointer, pointer + bytes) in this rank's copy, as every rank's
// copy of the buffer at the same offset (nullopt for other memory, and for bytes == 0). Thread-safe; forgets
// allocations freed since.
std::optional<PeerRange> find_symmetric_range(detail::MemoryContext& state, const void* pointer, size_t bytes);

}  // namespace braid

#include "memory/symmetric_memory.hpp"

#include <unistd.h>

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#include "core/hash.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/private_copy.hpp"
#include "memory/memory_context.hpp"
#include "memory/vmm.hpp"

namespace braid {
namespace detail {


SymmetricAllocation::~SymmetricAllocation() {
  DeviceGuard guard(device);
  // cudaFree synchronises the device, so no kernel of ours still reads the mappings we remove next.
  if (device_peer_pointers != nullptr) cudaFree(device_peer_pointers);
  const DriverApi& api = driver();
  if (view != 0) {
    for (int r = 0; r < world; ++r) {
      if (handles[r] != 0) release_quietly(api.cuMemUnmap(view + r * mapped_bytes, mapped_bytes), "cuMemUnmap(view)");
    }
    release_quietly(api.cuMemAddressFree(view, mapped_bytes * world), "cuMemAddressFree(view)");
  }
  for (int r = 0; r < world; ++r) {
    if (mappings[r] != 0) {
      release_quietly(api.cuMemUnmap(mappings[r], mapped_bytes), "cuMemUnmap");
      release_quietly(api.cuMemAddressFree(mappings[r], mapped_bytes), "cuMemAddressFree");
    }
    if (handles[r] != 0) release_quietly(api.cuMemRelease(handles[r]), "cuMemRelease");
  }
}

}  // namespace detail

namespace {

// Every rank must ask for the same size, of at least one byte; name the ranks that differ. Checked after the ranks
// exchanged their sizes, so that a rank asking for 0 bytes (kInvalidArgument) leaves no peer waiting: they raise
// kMismatch at once.
void check_same_size(detail::MemoryContext& comm, size_t bytes) {
  std::vector<std::string> sizes = comm.bootstrap->allgather(std::to_string(bytes), "symmetric alloc size");
  if (bytes == 0) raise_invalid_argument("Communicator::alloc", "bytes", "is 0; a symmetric allocation needs ≥ 1 byte");
  std::string differing;
  for (int r = 0; r < comm.size; ++r) {
    if (sizes[r] != sizes[0]) differing += fmt::format("{}rank {} asked for {} bytes", differing.empty() ? "" : ", ", r, sizes[r]);
  }
  if (!differing.empty()) {
    raise(ErrorCode::kMismatch, "Communicator::alloc: ranks asked for different sizes: rank 0 asked for {} bytes, {}",
          sizes[0], differing);
  }
}

}  // namespace

std::shared_ptr<detail::SymmetricAllocation> allocate_symmetric(const std::shared_ptr<detail::MemoryContext>& comm,
                                                               size_t bytes, const AllocOptions& options) {
  std::lock_guard<std::mutex> lock(comm->setup_mutex);
  DeviceGuard guard(comm->device);
  check_same_size(*comm, bytes);
  const uint64_t tag = comm->alloc_sequence++;

  auto allocation = std::make_shared<detail::SymmetricAllocation>();
  detail::SymmetricAllocation& a = *allocation;
  a.rank = comm->rank;
  a.world = comm->size;
  a.device = comm->device;
  a.bytes = bytes;
  a.sequence = tag;
  a.handles.assign(a.world, 0);
  a.mappings.assign(a.world, 0);

  const CUmemAllocationProp prop = detail::posix_fd_allocation_properties(a.device);
  const size_t align = detail::allocation_granularity(prop);
  if (bytes > SIZE_MAX - align) raise_invalid_argument("Communicator::alloc", "bytes", "is {}: too large", bytes);
  a.mapped_bytes = (bytes + align - 1) / align * align;
  if (options.contiguous_view && a.mapped_bytes > SIZE_MAX / a.world) {
    raise_invalid_argument("Communicator::alloc", "bytes", "is {}: the contiguous view of {} ranks overflows", bytes, a.world);
  }

  // Own memory: create, map, zero (before any peer can see it), export.
  BRAID_CU(cuMemCreate, &a.handles[a.rank], a.mapped_bytes, &prop, 0);
  a.mappings[a.rank] = detail::reserve_and_map(a.mapped_bytes, align, a.handles[a.rank], a.device);
  // NOTE [no device-wide waits]
  detail::fill_zeros_now(reinterpret_cast<void*>(a.mappings[a.rank]), a.mapped_bytes, comm->setup());
  detail::FdOwner exported;
  BRAID_CU(cuMemExportToShareableHandle, &exported.fd, a.handles[a.rank], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);

  // Exchange, import, map every peer's memory.
  std::vector<int> received = comm->fds->all_exchange(exported.fd, tag);
  std::vector<detail::FdOwner> peer_fds(a.world);
  for (int r = 0; r < a.world; ++r) peer_fds[r].fd = received[r];
  for (int r = 0; r < a.world; ++r) {
    if (r == a.rank) continue;
    BRAID_CU(cuMemImportFromShareableHandle, &a.handles[r], reinterpret_cast<void*>(static_cast<uintptr_t>(peer_fds[r].fd)),
             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    a.mappings[r] = detail::reserve_and_map(a.mapped_bytes, align, a.handles[r], a.device);
  }

  if (options.contiguous_view) {
    BRAID_CU(cuMemAddressReserve, &a.view, a.mapped_bytes * a.world, align, 0, 0);
    for (int r = 0; r < a.world; ++r) detail::map_for_device(a.view + r * a.mapped_bytes, a.mapped_bytes, a.handles[r], a.device);
  }

  a.peer_pointers.resize(a.world);
  for (int r = 0; r < a.world; ++r) a.peer_pointers[r] = reinterpret_cast<void*>(a.mappings[r]);
  BRAID_CUDA(cudaMalloc(reinterpret_cast<void**>(&a.device_peer_pointers), sizeof(void*) * a.world));
  detail::copy_to_device_now(a.device_peer_pointers, a.peer_pointers.data(), sizeof(void*) * a.world, comm->setup());
  BRAID_DEBUG("symmetric alloc #{}: {} bytes ({} mapped) on {} ranks{}", tag, bytes, a.mapped_bytes, a.world,
              options.contiguous_view ? " with contiguous view" : "");
  {
    std::lock_guard<std::mutex> registry(comm->symmetric_mutex);
    comm->symmetric_allocations.push_back(allocation);
  }
  return allocation;
}

std::optional<PeerRange> find_symmetric_range(detail::MemoryContext& state, const void* pointer, size_t bytes) {
  if (pointer == nullptr || bytes == 0) return std::nullopt;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard<std::mutex> lock(state.symmetric_mutex);
  auto& allocations = state.symmetric_allocations;
  std::optional<PeerRange> found;
  for (auto it = allocations.begin(); it != allocations.end();) {
    std::shared_ptr<detail::SymmetricAllocation> allocation = it->lock();
    if (!allocation) {
      it = allocations.erase(it);  // freed since: forget it
      continue;
    }
    const uintptr_t base = allocation->mappings[allocation->rank];
    if (begin >= base && begin - base < allocation->bytes && bytes <= allocation->bytes - (begin - base)) {
      const size_t offset = begin - base;
      PeerRange range{};
      for (int r = 0; r < allocation->world; ++r) range.buffers.at[r] = static_cast<char*>(allocation->peer_pointers[r]) + offset;
      range.aligned16 = offset % 16 == 0;  // every mapping starts on a granularity boundary
      range.same_process_peers = false;    // VMM mappings made here
      range.identity = mix64(mix64(allocation->sequence + 1) ^ offset);
      found = range;
    }
    ++it;
  }
  return found;
}

// ---- SymmetricMemory: the public handle ----

SymmetricMemory::SymmetricMemory(std::shared_ptr<detail::SymmetricAllocation> impl) : impl_(std::move(impl)) {}

namespace {
const detail::SymmetricAllocation& checked(const std::shared_ptr<detail::SymmetricAllocation>& impl, const char* call) {
  if (!impl) raise(ErrorCode::kInvalidArgument, "SymmetricMemory::{}: the handle is empty (freed or never allocated)", call);
  return *impl;
}
}  // namespace

size_t SymmetricMemory::bytes() const { return checked(impl_, "bytes").bytes; }
int SymmetricMemory::world_size() const { return checked(impl_, "world_size").world; }
int SymmetricMemory::rank() const { return checked(impl_, "rank").rank; }
void* SymmetricMemory::local() const {
  const auto& a = checked(impl_, "local");
  return a.peer_pointers[a.rank];
}
void* SymmetricMemory::peer(int rank) const {
  const auto& a = checked(impl_, "peer");
  if (rank < 0 || rank >= a.world) raise_invalid_argument("SymmetricMemory::peer", "rank", "is {}; must be in [0, {})", rank, a.world);
  return a.peer_pointers[rank];
}
void* const* SymmetricMemory::peers() const { return checked(impl_, "peers").peer_pointers.data(); }
void* const* SymmetricMemory::device_peers() const { return checked(impl_, "device_peers").device_peer_pointers; }
void* SymmetricMemory::view() const { return reinterpret_cast<void*>(checked(impl_, "view").view); }
size_t SymmetricMemory::view_stride() const { return checked(impl_, "view_stride").mapped_bytes; }
void SymmetricMemory::reset() { impl_.reset(); }

}  // namespace braid

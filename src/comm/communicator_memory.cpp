// Communicator's memory calls: registration of user buffers (local and cheap, memory/registration.hpp; the first
// call that uses a registered buffer exchanges its mappings), and global memory: every rank's export mapped
// here (import_global), and one-sided copies into and out of it (put, get).
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "braid/braid.hpp"
#include "comm/comm_state.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/export_import.hpp"
#include "memory/registration.hpp"
#include "memory/shareable.hpp"

namespace braid {

namespace {

// The exposure of registered buffers (BRAID_EAGER_ZERO_COPY on a CUDA-backend communicator of several ranks), or null.
detail::RegisteredExposures* exposures_of(detail::CommState& state) {
  if (state.cuda == nullptr) return nullptr;
  collectives::CollectiveContext& context = state.cuda->context();
  return context.eager_zero_copy ? context.exposures.get() : nullptr;
}

}  // namespace

RegisteredBuffer Communicator::register_buffer(void* pointer, size_t bytes) {
  detail::CommState& state = detail::usable(state_, "Communicator::register_buffer");
  set_log_rank(state.rank);
  const detail::MemoryDescriptor descriptor =
      detail::describe_shareable("Communicator::register_buffer", "pointer", pointer, bytes, state.device);
  RegisteredBuffer buffer;
  buffer.impl_ = state.registrations->add(state.registrations, descriptor);
  BRAID_DEBUG("registered {} bytes at {} ({}) as registration {}", bytes, pointer, detail::memory_kind_name(descriptor.kind),
              buffer.impl_->id);
  if (detail::RegisteredExposures* exposures = exposures_of(state)) {
    const bool everywhere = exposures->expose(buffer.impl_->id, descriptor);
    BRAID_DEBUG("registration {} {}", buffer.impl_->id, everywhere ? "exposed to every peer" : "not exposed");
  }
  return buffer;
}

void Communicator::deregister(RegisteredBuffer& buffer) {
  if (!buffer.impl_) raise_invalid_argument("Communicator::deregister", "buffer", "is empty (never registered or already deregistered)");
  detail::CommState& state = detail::usable(state_, "Communicator::deregister");
  if (buffer.impl_->cache.lock() != state.registrations) {
    raise_invalid_argument("Communicator::deregister", "buffer", "was registered with another communicator");
  }
  // Exposed: this rank's calls end and every peer releases the range before the registration goes (throws on a
  // timeout, the registration then gone all the same).
  if (detail::RegisteredExposures* exposures = exposures_of(state)) {
    try {
      exposures->withdraw(buffer.impl_->id);
    } catch (...) {
      buffer.impl_->release();
      buffer.impl_.reset();
      throw;
    }
  }
  buffer.impl_->release();
  buffer.impl_.reset();
}

RegistrationStats Communicator::registration_stats() {
  detail::CommState& state = detail::usable(state_, "Communicator::registration_stats");
  RegistrationStats stats = state.registrations->stats();
  if (state.nccl) stats.nccl_registered = state.nccl->registered_count();
  if (detail::RegisteredExposures* exposures = exposures_of(state)) {
    stats.exposed_at_first_use = exposures->automatic_count();
    stats.exposed = exposures->exposed_count() + stats.exposed_at_first_use;
    stats.peer_exposures = exposures->imported_count();
  }
  return stats;
}

GlobalMemory Communicator::import_global(const ExportedHandle& mine) {
  const char* function = "Communicator::import_global";
  detail::CommState& state = detail::usable(state_, function);
  detail::require_cuda_backend(state, function);  // the same on every rank
  // A handle refused here still joins the exchange (import_every_rank), so that the peers fail at once.
  const detail::ExportedRange* exported = mine ? mine.impl_.get() : nullptr;
  std::string refusal = exported == nullptr ? "is an empty handle" : "";
  if (exported != nullptr &&
      (exported->descriptor.device != state.device || exported->descriptor.pid != static_cast<uint32_t>(getpid()))) {
    refusal = fmt::format("was exported from GPU {} of process {}; this rank is GPU {} of process {}",
                          exported->descriptor.device, exported->descriptor.pid, state.device, getpid());
  }
  set_log_rank(state.rank);
  detail::ImportedPeers imported =
      detail::import_every_rank(state, refusal.empty() ? exported : nullptr, refusal, function);
  GlobalMemory global;
  global.rank_ = state.rank;
  global.own_ = mine;
  global.peers_ = std::move(imported.peers);
  global.bytes_ = std::move(imported.bytes);
  global.mappings_ = std::move(imported.mappings);
  global.communicator_ = state_;
  return global;
}

namespace {

// Rank `peer`'s [offset, offset + bytes) of global memory, as mapped here; out-of-range arguments are refused.
char* range_at(const GlobalMemory& memory, const char* function, int peer, size_t offset, size_t bytes) {
  if (!memory) raise_invalid_argument(function, "memory", "is empty");
  if (peer < 0 || peer >= memory.world_size()) raise_invalid_argument(function, "peer", "is {}; must be in [0, {})", peer, memory.world_size());
  if (offset > memory.bytes(peer)) {
    raise_invalid_argument(function, "offset", "is {}: past the end of rank {}'s {} bytes", offset, peer,
                           memory.bytes(peer));
  }
  if (bytes > memory.bytes(peer) - offset) {
    raise_invalid_argument(function, "bytes", "is {} at offset {}: past the end of rank {}'s {} bytes", bytes, offset,
                           peer, memory.bytes(peer));
  }
  return static_cast<char*>(memory.peer(peer)) + offset;
}

}  // namespace

void Communicator::put(const GlobalMemory& memory, int peer, size_t offset, const void* source, size_t bytes, Stream stream) {
  detail::CommState& state = detail::enter(state_, "Communicator::put", stream);
  char* destination = range_at(memory, "Communicator::put", peer, offset, bytes);
  if (bytes == 0) return;
  if (source == nullptr) raise_invalid_argument("Communicator::put", "source", "is null");
  const auto order = detail::ordered(state, stream);
  BRAID_CUDA(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
}

void Communicator::get(const GlobalMemory& memory, int peer, size_t offset, void* destination, size_t bytes, Stream stream) {
  detail::CommState& state = detail::enter(state_, "Communicator::get", stream);
  const char* source = range_at(memory, "Communicator::get", peer, offset, bytes);
  if (bytes == 0) return;
  if (destination == nullptr) raise_invalid_argument("Communicator::get", "destination", "is null");
  const auto order = detail::ordered(state, stream);
  BRAID_CUDA(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
}

}  // namespace braid

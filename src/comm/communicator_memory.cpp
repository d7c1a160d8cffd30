// Communicator's registration of user buffers: local and cheap (memory/registration.hpp); the first call that
// uses a registered buffer exchanges its mappings.
#include "braid/braid.hpp"
#include "comm/comm_state.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/registration.hpp"
#include "memory/shareable.hpp"

namespace braid {

RegisteredBuffer Communicator::register_buffer(void* pointer, size_t bytes) {
  detail::CommState& state = detail::usable(state_, "Communicator::register_buffer");
  set_log_rank(state.rank);
  const detail::MemoryDescriptor descriptor =
      detail::describe_shareable("Communicator::register_buffer", "pointer", pointer, bytes, state.device);
  RegisteredBuffer buffer;
  buffer.impl_ = state.registrations->add(state.registrations, descriptor);
  BRAID_DEBUG("registered {} bytes at {} ({}) as registration {}", bytes, pointer, detail::memory_kind_name(descriptor.kind),
              buffer.impl_->id);
  return buffer;
}

void Communicator::deregister(RegisteredBuffer& buffer) {
  if (!buffer.impl_) raise_invalid_argument("Communicator::deregister", "buffer", "is empty (never registered or already deregistered)");
  if (buffer.impl_->cache.lock() != detail::usable(state_, "Communicator::deregister").registrations) {
    raise_invalid_argument("Communicator::deregister", "buffer", "was registered with another communicator");
  }
  buffer.impl_->release();
  buffer.impl_.reset();
}

RegistrationStats Communicator::registration_stats() {
  detail::CommState& state = detail::usable(state_, "Communicator::registration_stats");
  RegistrationStats stats = state.registrations->stats();
  if (state.nccl) stats.nccl_registered = state.nccl->registered_count();
  return stats;
}

}  // namespace braid

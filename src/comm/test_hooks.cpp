#include "comm/test_hooks.hpp"

#include <cuda_runtime_api.h>

#include <vector>

#include "collectives/selection.hpp"
#include "comm/comm_state.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "memory/shareable.hpp"

namespace braid {

namespace detail {
struct TestAccess {
  static CommState& state(Communicator& comm, const char* function) { return usable(comm.state_, function); }
};
}  // namespace detail

namespace testing {

void set_ll_sequence(Communicator& comm, uint64_t calls_so_far, uint64_t stamped_by) {
  const char* function = "testing::set_ll_sequence";
  detail::CommState& state = detail::TestAccess::state(comm, function);
  collectives::CollectiveContext& cuda = detail::cuda_context(state, function);
  {
    DeviceGuard guard(state.device);
    BRAID_CUDA(cudaDeviceSynchronize());  // this rank's calls are done, so are its peers' stores into its area
    // The area is [parity 2][sender][line] of 16-byte lines {data, flag, data, flag}: a half at a time.
    const size_t half_bytes = cuda.ll.bytes() / 2;
    std::vector<uint32_t> words(half_bytes / sizeof(uint32_t), 0);
    for (uint64_t parity = 0; parity < 2; ++parity) {
      const uint64_t sequence = stamped_by + ((stamped_by ^ parity) & 1);  // the one of this parity
      for (size_t i = 1; i < words.size(); i += 2) words[i] = static_cast<uint32_t>(sequence);
      BRAID_CUDA(cudaMemcpy(static_cast<char*>(cuda.ll.local()) + parity * half_bytes, words.data(), half_bytes,
                            cudaMemcpyHostToDevice));
    }
    cuda.sync->set_ll_epoch_for_testing(calls_so_far);
    BRAID_CUDA(cudaDeviceSynchronize());
  }
  comm.barrier();  // no rank's next LL call stores into an area its owner is still stamping
}

void announce_at_every_size(bool on) { set_announce_at_every_size(on); }

void set_ll_sequence(Communicator& comm, uint64_t calls_so_far) { set_ll_sequence(comm, calls_so_far, calls_so_far - 1); }

namespace {

detail::RegisteredExposures& exposures_of(Communicator& comm, const char* function) {
  detail::CommState& state = detail::TestAccess::state(comm, function);
  collectives::CollectiveContext& cuda = detail::cuda_context(state, function);
  if (cuda.exposures == nullptr) raise(ErrorCode::kUnsupported, "{}: the communicator exposes nothing (one rank, or BRAID_EAGER_ZERO_COPY is not 1)", function);
  return *cuda.exposures;
}

}  // namespace

uint64_t expose(Communicator& comm, uint64_t key, void* pointer, size_t bytes) {
  const char* function = "testing::expose";
  detail::RegisteredExposures& exposures = exposures_of(comm, function);
  const detail::MemoryDescriptor descriptor = detail::describe_shareable(function, "pointer", pointer, bytes, comm.device());
  if (!exposures.expose(key, descriptor)) return 0;
  const std::optional<detail::RegisteredExposures::Found> found = exposures.find(descriptor.address, bytes);
  return found ? found->id : 0;
}

void withdraw(Communicator& comm, uint64_t key) { exposures_of(comm, "testing::withdraw").withdraw(key); }

ExposedEntry exposed_entry(Communicator& comm, int owner, uint64_t id) {
  detail::RegisteredExposures& exposures = exposures_of(comm, "testing::exposed_entry");
  if (owner < 0 || owner >= comm.size()) raise_invalid_argument("testing::exposed_entry", "owner", "is {}", owner);
  const ExposedRange entry = exposures.table_entry(owner, id);
  return {entry.id, entry.base, entry.bytes};
}

size_t imported_exposures(Communicator& comm) { return exposures_of(comm, "testing::imported_exposures").imported_count(); }

void expose_automatically(bool on) { detail::set_automatic_exposures(on); }

}  // namespace testing
}  // namespace braid

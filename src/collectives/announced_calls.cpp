#include "collectives/announced_calls.hpp"

#include <cstdint>
#include <optional>

#include "memory/registered_exposures.hpp"

namespace braid::collectives {

// Staged where no exposed range holds it, or it or a block is not 16-byte aligned, as the zero-copy stores want.
uint64_t announcement_of(const CollectiveContext& state, const void* pointer, size_t bytes, size_t block) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  if (state.exposures == nullptr || pointer == nullptr || address % 16 != 0 || block % 16 != 0) {
    return kernels::kAnnouncedStaged;
  }
  const std::optional<detail::RegisteredExposures::Found> found = state.exposures->find_or_expose(address, bytes);
  return found ? kernels::announcement(found->id, found->offset) : kernels::kAnnouncedStaged;
}

bool announces(const CollectiveContext& state, const CallShape& shape, const AreaCapacities& capacities) {
  return state.eager_zero_copy && state.exposures != nullptr && state.order.call_graph() == nullptr &&
         !plans_ll(shape, capacities);
}

kernels::AnnouncedLaunch announced_launch(const CollectiveContext& state, const kernels::StagedLaunch& staged,
                                          std::initializer_list<AnnouncedBuffer> buffers) {
  kernels::AnnouncedLaunch launch{};
  launch.staged = staged;
  for (const AnnouncedBuffer& buffer : buffers) {
    launch.words[launch.buffers] = announcement_of(state, buffer.pointer, buffer.bytes, buffer.block);
    launch.extents[launch.buffers] = buffer.bytes;
    ++launch.buffers;
  }
  launch.area.local = static_cast<uint64_t*>(state.announcements.local());
  launch.area.peers = reinterpret_cast<uint64_t* const*>(state.announcements.device_peers());
  launch.exposures = kernels::ExposureLookup{state.exposures->device_table(), state.exposures->device_cache()};
  return launch;
}

}  // namespace braid::collectives

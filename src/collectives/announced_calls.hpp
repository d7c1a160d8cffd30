// The host side of the announcing kernels (kernels/announced.cuh), for every collective that announces: whether an
// eager call announces, and its launch with this rank's words.
#pragma once

#include <cstddef>
#include <initializer_list>

#include "collectives/collective_context.hpp"
#include "collectives/planner.hpp"
#include "kernels/announced_launch.hpp"

namespace braid::collectives {

// Whether an eager call beyond LL announces its buffers (BufferFacts::announced): the same on every rank, from the
// agreed switch and the call alone. The planner takes the announcing row only at the sizes where it pays.
bool announces(const CollectiveContext& state, const CallShape& shape, const AreaCapacities& capacities);

// A buffer a call announces: where it starts (null: none, announced as staged), its bytes (the same on every
// rank) and its rank blocks' bytes.
struct AnnouncedBuffer {
  const void* pointer;
  size_t bytes;
  size_t block;
};

// This rank's announcement of [pointer, pointer + bytes), whose rank blocks are `block` bytes each: where it lies
// among the ranges it exposed (registered, or exposed automatically now where that applies: NOTE [automatic
// exposures], memory/registered_exposures.hpp), or kernels::kAnnouncedStaged.
uint64_t announcement_of(const CollectiveContext& state, const void* pointer, size_t bytes, size_t block);

// The announcing launch over `staged` (the launch its staged path uses, with the call's plan word): this rank's
// word for each of `buffers`, the announcement area and the exposure lookup.
kernels::AnnouncedLaunch announced_launch(const CollectiveContext& state, const kernels::StagedLaunch& staged,
                                          std::initializer_list<AnnouncedBuffer> buffers);

}  // namespace braid::collectives

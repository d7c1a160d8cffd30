// The zero-copy view of one buffer of a call.
#pragma once

#include <cstddef>
#include <optional>

#include "collectives/plan.hpp"
#include "collectives/selection.hpp"
#include "memory/peer_range.hpp"

namespace braid::collectives {

struct CollectiveContext;

// find_peer_range inside the call's ordering scope. Before a registered buffer's first use exchanges mappings
// (every rank must join), a barrier (signal channel 0) runs at once, after the eager work, even while capturing,
// announcing exchange_plan_word: a peer that does not join runs other kernels, so both fail with kMismatch rather
// than one waiting in an exchange. A captured call registers an unregistered buffer automatically (unless
// BRAID_AUTO_REGISTER=0) after the same barrier, the graph holding the mappings; eager calls get nullopt. Eager
// calls under BRAID_EAGER_ZERO_COPY find symmetric memory, and where every rank is a process of its own, at the
// sizes of NOTE [exchanged sizes], every rank's exposed buffer through a host exchange that every rank joins (NOTE
// [exchanged exposures]); other registered buffers are announced instead.
// `in_place`: whether this rank's call runs in place, where its plan depends on it (reduce-scatter, all-reduce,
// all-to-all): an exchange whose ranks differ there finds nothing, so that every rank plans alike.
std::optional<PeerRange> call_buffer_range(CollectiveContext& state, Collective collective, ExchangedBuffer buffer,
                                           const void* pointer, size_t bytes, bool in_place = false);

}  // namespace braid::collectives

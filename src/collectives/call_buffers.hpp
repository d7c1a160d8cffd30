// The zero-copy view of one buffer of a call, agreed on by every rank before a registered buffer's mappings are
// exchanged.
#pragma once

#include <cstddef>
#include <optional>

#include "collectives/plan.hpp"
#include "collectives/selection.hpp"
#include "memory/peer_range.hpp"

namespace braid::collectives {

struct CollectiveContext;

// find_peer_range for the `buffer` argument of a `collective` call, made inside the call's ordering scope. The
// first use of a registered buffer at an address exchanges mappings on the host, which every rank must join;
// before it, this rank runs one barrier (signal channel 0) announcing exchange_plan_word. A peer that joins runs
// the same barrier; a peer whose buffer there is not registered (or whose mappings are cached from before) runs
// the call's kernels instead, whose plan differs, so both ranks fail with kMismatch (here: raised, nothing
// exchanged) instead of one waiting in an exchange the other never joins. The barrier runs at once, after the
// communicator's eager work, also while the call is being captured.
// A buffer neither symmetric nor registered, in a call being captured (CallOrder::call_graph), is registered
// automatically (unless BRAID_AUTO_REGISTER=0): the same barrier, announcing an automatic exchange, then
// exchange_automatically; the capturing graph holds the peers' mappings. Eager calls of such buffers are staged
// (nullopt).
std::optional<PeerRange> call_buffer_range(CollectiveContext& state, Collective collective, ExchangedBuffer buffer,
                                           const void* pointer, size_t bytes);

}  // namespace braid::collectives

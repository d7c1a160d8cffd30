// Automatic registration: the zero-copy view of a buffer that is neither symmetric nor registered, for a call being
// captured into a CUDA graph. Every rank joins one exchange per such buffer at capture time (the call is the same on
// every rank, so every rank reaches it), describing the allocation its buffer lies in, or nothing when that memory
// cannot be shared; the view exists only when every rank's can. Replays make no host call: each graph holds the
// peers' mappings its launches use, and releases them when it is destroyed.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>

#include "memory/peer_range.hpp"

namespace braid::detail {

struct MemoryContext;

struct AutomaticRange {
  PeerRange range;
  // The peers' mappings the range uses: whoever holds this keeps them mapped. Dropping it makes CUDA calls.
  std::shared_ptr<const void> mappings;
};

// Whether BRAID_AUTO_REGISTER (the process environment, read once) leaves automatic registration on.
bool automatic_registration_on();

// Collective over the communicator: this rank's [pointer, pointer + bytes) described (its allocation's CUDA buffer
// id keys the peers' caches, so a range freed and allocated again is mapped anew), `before_exchange` run (it makes
// sure that every peer joins), then the exchange. nullopt on every rank when some rank's memory cannot be shared.
std::optional<AutomaticRange> exchange_automatically(MemoryContext& state, const void* pointer, size_t bytes,
                                                     const std::function<void()>& before_exchange);

}  // namespace braid::detail

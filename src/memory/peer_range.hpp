// Every rank's copy of one buffer, mapped here: what the zero-copy kernels read and write. Filled from a
// symmetric allocation of the communicator or from a registered user buffer, and passed to kernels by value,
// so a launch carries its own snapshot of the peers' addresses (graph replays included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "core/limits.hpp"

namespace braid {

namespace detail {
struct MemoryContext;
}

struct PeerBuffers {
  char* at[kMaxWorld];  // [rank]: that rank's buffer as mapped in this process ([own rank]: the buffer itself)
};

struct PeerRange {
  PeerBuffers buffers;
  bool aligned16;  // every rank's buffer starts on a 16-byte boundary (the same answer on every rank)
  // Some peer's buffer is another GPU's cudaMalloc memory of this very process (ranks as threads). A copy-engine
  // copy from it is a peer copy that CUDA orders against the legacy default streams of both GPUs, so a peer
  // thread's own legacy-stream work could wait on our copy, which waits on that peer: kernels serve such buffers.
  bool same_process_peers;
  // The same on every rank that passes the same buffer (a symmetric allocation at the same offset, a registered
  // buffer whose mappings were exchanged): what the ranks compare to agree that a call runs zero copy.
  uint64_t identity;
};

// The zero-copy view of [pointer, pointer + bytes) on this rank: from a symmetric allocation of `state` (every
// rank passes its copy at the same offset), else from a buffer registered with `state` (its first use with this
// pointer exchanges mappings with the peers: collective, so every rank must pass a registered buffer there),
// else nullopt (staging). nullopt for bytes == 0. `before_exchange` runs right before such an exchange: it makes
// sure that every peer is about to join it (and throws when one is not), since a rank whose buffer is not
// registered there never would.
std::optional<PeerRange> find_peer_range(detail::MemoryContext& state, const void* pointer, size_t bytes,
                                         const std::function<void()>& before_exchange);

}  // namespace braid

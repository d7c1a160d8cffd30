// Every rank's base of one of the communicator's symmetric areas, for a kernel's launch arguments.
#pragma once

#include "braid/memory.hpp"
#include "core/limits.hpp"

namespace braid::collectives {

// By value in the arguments, a peer's base comes from the constant cache; the area's device table would cost a
// load from memory ahead of the first store to that peer. `peers`: the area's host table of `world` bases.
inline void copy_peer_bases(void* const* peers, int world, char* (&bases)[kMaxWorld]) {
  for (int r = 0; r < world; ++r) bases[r] = static_cast<char*>(peers[r]);
}

inline void copy_peer_bases(const SymmetricMemory& area, char* (&bases)[kMaxWorld]) {
  copy_peer_bases(area.peers(), area.world_size(), bases);
}

}  // namespace braid::collectives

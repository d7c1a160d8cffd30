// The symmetric-memory check shared by braid-bench's smoke run and the GPU tests: every rank writes a fresh
// random pattern into its region of every peer's buffer (through peer pointers or the contiguous view), and
// every rank checks each region it received.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "pattern.hpp"

namespace braid::check {

enum class Route { kPeerPointer, kContiguousView };
const char* route_name(Route route);

struct PeerWriteReport {
  size_t region_bytes = 0;
  Route route = Route::kPeerPointer;
  std::vector<PatternCheck> received;  // [writer]: what this rank found in the region `writer` wrote
  uint64_t wrong_bytes() const;
  std::string describe_failures(int rank) const;  // "" when every byte arrived
};

// Collective: region_bytes may be any size (odd sizes put writes at unaligned offsets).
PeerWriteReport peers_write_owners_check(Communicator& comm, size_t region_bytes, Route route);

// Every rank learns every rank's value through symmetric memory itself (copy-engine writes into peers).
std::vector<uint64_t> exchange_through_peers(Communicator& comm, uint64_t mine);

uint64_t fresh_seed();

}  // namespace braid::check

// The symmetric-memory smoke run (braid-bench --smoke): every rank writes a fresh random pattern into its
// region of each peer's buffer, through peer pointers and through the contiguous view, and every rank checks
// what it received; rank 0 prints one row per check. It needs no collective, so it tells memory and mapping
// faults apart from collective bugs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/braid.hpp"

namespace braid::bench {

// Region sizes per peer: min, min * factor, ... up to max (each also at +3 bytes, for odd offsets).
// Returns the wrong bytes seen by all ranks together (0: passed).
uint64_t smoke_run(Communicator& comm, size_t min_bytes, size_t max_bytes, size_t factor);

}  // namespace braid::bench

// What each rank measured of one row's cases, and its gathering: rank 0 prints the row from every rank's slots.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/braid.hpp"

namespace braid::bench {

// One case (an implementation and a placement or phase) on this rank, shared with every rank at the end of a row.
struct Slot {
  double time_us = 0;
  uint64_t wrong = 0;
  int32_t state = 0;  // 0: not run, 1: run unchecked, 2: run and checked
};

// Every rank's `count` slots gathered on the host (collective): into `total`, each case's times combined as -a asks
// (`average`, combine_rank_times), its wrong elements summed over ranks and the last rank's state.
void gather_slots(Communicator& comm, const Slot* slots, size_t count, int average, Slot* total);

}  // namespace braid::bench

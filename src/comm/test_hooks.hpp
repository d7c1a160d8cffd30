// Hooks for the GPU tests (tests/gpu), never for users: they put a communicator into states that calls would
// take too long to reach. Internal header; the functions live in libbraid.so so that tests can reach a
// Communicator's state.
#pragma once

#include <cstdint>

#include "braid/braid.hpp"

namespace braid::testing {

// Collective, on a communicator of the CUDA backend (kUnsupported otherwise), with none of its work in flight
// on any rank. Makes `calls_so_far` the number of LL calls made (the next one has sequence calls_so_far + 1,
// its flag that cut to 32 bits) and stamps every line of this rank's LL area, data zero, as if LL calls
// `stamped_by` and `stamped_by` + 1 had written it (each line the flag of the one of its parity). Returns
// once every rank has done so (host barrier).
//
// Calls leave every line stamped by one of the last kLLRestampPeriod or so calls (kernels/ll.cuh), so
// stamped_by = calls_so_far - 1 (the overload below) is a state calls reach. An older stamped_by (more than a
// period, less than 2^32 calls below) plants lines calls never leave: they would pass for the data of LL calls
// stamped_by + 2^32 and stamped_by + 2^32 + 1, unless the periodic re-stamping replaces them first.
void set_ll_sequence(Communicator& comm, uint64_t calls_so_far, uint64_t stamped_by);
void set_ll_sequence(Communicator& comm, uint64_t calls_so_far);

// Every eager call that announces its buffers (BRAID_EAGER_ZERO_COPY) does so at every size beyond LL, not only
// where it pays (NOTE [announced sizes]), while `on`: for every communicator of this process. Set it alike on
// every rank, with no call in flight, and set it back.
void announce_at_every_size(bool on);

// The exposure of ranges to the peers (memory/registered_exposures.hpp), outside registration: on a communicator
// of the CUDA backend with more than one rank and BRAID_EAGER_ZERO_COPY=1 (kUnsupported otherwise). Not collective: the peers'
// helper threads answer.
// Exposes [pointer, pointer + bytes) (device memory as register_buffer takes it) under `key` (this rank's choice,
// one range a key): the exposure's id, or 0 where some peer could not map it.
uint64_t expose(Communicator& comm, uint64_t key, void* pointer, size_t bytes);
// Waits for this rank's calls, then has every peer release the range exposed under `key`.
void withdraw(Communicator& comm, uint64_t key);
// What this rank's exposure table holds for `owner`'s exposure `id`: {id, base, bytes} (id 0: nothing, or
// another id: another range), and how many peers' ranges this rank has mapped.
struct ExposedEntry {
  uint64_t id;
  uint64_t base;
  uint64_t bytes;
};
ExposedEntry exposed_entry(Communicator& comm, int owner, uint64_t id);
size_t imported_exposures(Communicator& comm);
// Whether buffers nobody registered are exposed at their first use, for every communicator of this process (on
// unless turned off). Set it alike on every rank, with no call in flight.
void expose_automatically(bool on);

}  // namespace braid::testing

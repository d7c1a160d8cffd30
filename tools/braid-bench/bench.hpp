// One rank's collective benchmark: for each collective and size, check one call against the host reference,
// then time calls; rank 0 prints the rows (and writes --json).
//
// Timing, per (size, placement, implementation): warm-up calls; then `repeats` repetitions, each after a
// stream synchronise, a host barrier and one untimed call (it absorbs the barrier's skew between ranks, so
// the timed calls start together), of `iters` calls (or ceil(iters / G) replays of a graph of G calls)
// between two CUDA events on the rank's stream (with -z 1 the host waits for each call in between). A rank's
// time is its median repetition per call; the row shows the max over ranks, or what -a asks for.
#pragma once

#include <cstdint>
#include <memory>

#include "braid/braid.hpp"
#include "nccl.hpp"
#include "options.hpp"

namespace braid::bench {

// Runs every collective and size of `options` on this rank (collective over the ranks of `comm`); `nccl`
// is null unless NCCL is compared. Returns the wrong elements summed over all ranks, braid's and NCCL's
// (0: every result checked right, or nothing checked). Throws on any failure of braid, NCCL or CUDA.
uint64_t bench_run(Communicator& comm, const Options& options, const std::shared_ptr<NcclLibrary>& nccl);

}  // namespace braid::bench

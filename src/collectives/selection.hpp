// The one selection table: which algorithm and how many blocks (channels) serve a collective of a given size,
// world size and datatype. BRAID_ALGO overrides the algorithm per collective ("allreduce=twoshot,...").
#pragma once

#include <cstddef>
#include <string>

#include "braid/types.hpp"
#include "kernels/collective_id.hpp"

namespace braid {

const char* collective_name(unsigned int collective);  // "all_reduce", ... (also for ids the device reports)

// kLL: flag-in-data pushes, no barrier (all-reduce, small); kLL128: the same in 128-byte lines of 120 payload
// bytes (all-reduce; a send/recv pair's message, send_recv_lines_launch.hpp); kOneShot: every rank reads every peer's staged copy;
// kTwoShot: pipelined reduce-scatter + all-gather by pushes; kPipelined: pushes through FIFOs (reduce-scatter,
// all-gather, all-to-all; on buffers peers map, zero copy: all-to-all and all-gather store straight into the
// peers' outputs, reduce-scatter loads straight from the peers' inputs);
// kStaged: copy into staging halves, barrier, read (reduce-scatter, all-gather, reduce, broadcast);
// kCopyEngine: copy engines between two barrier kernels, on buffers peers map (copy_engine.hpp): all-to-all,
// all-gather and broadcast push into the peers' outputs; a send/recv pair's chunks go into the receiver's
// pipeline area, and SMs copy them out there (send_recv_bulk_launch.hpp), as do the blocks of an all-to-all,
// an all-gather or a broadcast on buffers no peer maps (copy_engine_pairs.hpp);
// kMulticast: NVLink multicast through the communicator's multicast region (all-reduce, reduce, all-gather),
// only where BRAID_ENABLE_MULTICAST opened it and the call is one the kernels serve (multicast_launch.hpp);
// kSplit: staged in two phases, one part of the data per rank (reduce, broadcast): rank r reduces part r of every
// rank's copy, or fetches part r from the root, into its staging; after a second barrier the root gathers the
// parts, or every rank fetches the others' parts from their owners.
enum class Algorithm { kLL, kOneShot, kTwoShot, kPipelined, kStaged, kCopyEngine, kMulticast, kSplit, kLL128 };
const char* algorithm_name(Algorithm algorithm);

constexpr int kMaxBlocks = 64;  // channels of one launch, for every algorithm (the signal pad has this many per set)

// Where the user's buffers live: anywhere (peers cannot map them: staging, FIFOs or LL lines carry the data), or
// in a symmetric allocation of the communicator on every rank at the same offset (peers read and write them in
// place: zero copy).
enum class Buffers { kAny, kSymmetric };

struct Choice {
  Algorithm algorithm;
  int blocks;  // channels of one launch
};

// What a protocol needs beyond the table's keys, which not every call has: a row (or a BRAID_ALGO entry) whose
// protocol's gate is closed does not apply. The table then goes on to its next matching row; a forced protocol
// whose gate is closed runs pipelined (FIFO pushes, which serve every buffer), except a forced multicast, which
// takes the table's choice. Neither ever lands on LL where the table did not choose it, so whether a call runs LL
// never depends on the buffers (runs_ll).
struct Gates {
  bool multicast = false;     // the communicator has a multicast region and its kernels serve the call
  bool copy_engines = false;  // every peer maps the buffers the copy engines write or read there, none of them
                              // another GPU's cudaMalloc memory of this process (copy_engine.hpp), or the
                              // engines write into the peers' pipeline areas (send/recv; copy_engine_pairs.hpp)
  bool ll_fits = true;        // one LL launch carries the call (all-to-all: a rank block fits an LL slot)
  bool ll128 = true;          // every pair of GPUs delivers a warp's 128-byte line whole (NVLink; not PCIe):
                              // agreed at communicator init, so the same on every rank
};

// `bytes`: the collective's size as nccl-tests counts it (all-reduce: the buffer; all-gather: the output;
// reduce-scatter and all-to-all: the input). All-to-all-v ignores it: its sizes differ between ranks, and the
// launch width must be the same on all of them. `override_text` is BRAID_ALGO's value ("" for none); errors name
// the variable. The cut-offs are in bytes; a row may serve the fp8 types alone, where their reductions' cost moves a
// cut-off (the sweeps per datatype: docs/dev/selection.md). The types the multicast kernels serve reach the table
// through `gates.multicast`.
Choice select_algorithm(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
                        Buffers buffers = Buffers::kAny, Gates gates = {});

// Whether the call runs LL or LL128 (lines that carry their flags), whatever its buffers are: the table's LL and
// LL128 rows serve every buffer kind
// (tests/cpu/test_selection.cpp checks it), so ranks agree on LL from the call alone, and an LL call looks up no
// buffer (no peer mapping, no first-use exchange of a registered buffer). `gates.copy_engines` plays no part.
bool runs_ll(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
             Gates gates = {});

}  // namespace braid

// The one selection table: which algorithm and how many blocks (channels) serve a collective of a given size,
// world size and datatype. BRAID_ALGO overrides the algorithm per collective ("allreduce=twoshot,...").
#pragma once

#include <cstddef>
#include <string>

#include "braid/types.hpp"

namespace braid {

enum class Collective : unsigned int {
  kAllReduce = 1,
  kReduce = 2,
  kReduceScatter = 3,
  kAllGather = 4,
  kBroadcast = 5,
  kAllToAll = 6,   // uniform blocks
  kAllToAllv = 7,  // per-peer counts (host or device arrays)
  kMoeDispatch = 8,  // not in the table (src/moe has its own kernels); ids for error reports
  kMoeCombine = 9,
  kSendRecv = 10,  // not in the table: runs all-to-all-v's pipelined kernel (its row) on the peers of a batch
};
const char* collective_name(unsigned int collective);  // "all_reduce", ... (also for ids the device reports)

// kLL: flag-in-data pushes, no barrier (all-reduce, small); kOneShot: every rank reads every peer's staged copy;
// kTwoShot: pipelined reduce-scatter + all-gather by pushes; kPipelined: pushes through FIFOs (reduce-scatter,
// all-gather, all-to-all; on buffers peers map, zero copy: all-to-all and all-gather store straight into the
// peers' outputs, reduce-scatter loads straight from the peers' inputs);
// kStaged: copy into staging halves, barrier, read (reduce-scatter, all-gather, reduce, broadcast);
// kCopyEngine: copy engines between two barrier kernels, on buffers peers map (copy_engine.hpp): all-to-all
// pulls from the peers' inputs, all-gather and broadcast push into their outputs;
// kMulticast: NVLink multicast through the communicator's multicast region (all-reduce, reduce, all-gather),
// only where BRAID_ENABLE_MULTICAST opened it and the call is one the kernels serve (multicast_launch.hpp).
enum class Algorithm { kLL, kOneShot, kTwoShot, kPipelined, kStaged, kCopyEngine, kMulticast };
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

// `bytes`: the collective's size as nccl-tests counts it (all-reduce: the buffer; all-gather: the output;
// reduce-scatter and all-to-all: the input). All-to-all-v ignores it: its sizes differ between ranks, and the
// launch width must be the same on all of them. `override_text` is BRAID_ALGO's value ("" for none); errors name the variable.
// `multicast`: the communicator has a multicast region and the kernels serve this call; without it no multicast
// row matches, and a forced multicast takes the table's unicast choice.
Choice select_algorithm(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
                        Buffers buffers = Buffers::kAny, bool multicast = false);

// Whether the call runs LL, whatever its buffers are: the table's LL rows serve every buffer kind
// (tests/cpu/test_selection.cpp checks it), so ranks agree on LL from the call alone, and an LL call looks up no
// buffer (no peer mapping, no first-use exchange of a registered buffer).
bool runs_ll(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
             bool multicast = false);

}  // namespace braid

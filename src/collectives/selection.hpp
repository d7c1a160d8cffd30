// The one selection table: which algorithm and how many blocks (channels) serve a collective of a given size,
// world size and datatype. BRAID_ALGO overrides the algorithm per collective ("allreduce=twoshot,...").
#pragma once

#include <cstddef>
#include <string>

#include "braid/types.hpp"
#include "kernels/collective_id.hpp"

namespace braid {

const char* collective_name(unsigned int collective);  // "all_reduce", ... (also for ids the device reports)

// kLL: flag-in-data lines, no barrier; kLL128: the same in 128-byte lines (120 payload bytes); kOneShot: every
// rank reads every peer's staged copy; kTwoShot: pipelined reduce-scatter + all-gather; kPipelined: FIFO pushes,
// or zero-copy stores and loads where peers map the buffers; kStaged: copy into staging halves, barrier, read;
// kCopyEngine: copy_engine.hpp, copy_engine_pairs.hpp; kMulticast: NVLink multicast (multicast_launch.hpp);
// kSplit: staged in two phases, rank r reducing or fetching part r.
enum class Algorithm { kLL, kOneShot, kTwoShot, kPipelined, kStaged, kCopyEngine, kMulticast, kSplit, kLL128 };
const char* algorithm_name(Algorithm algorithm);

constexpr int kMaxBlocks = 64;  // channels of one launch, for every algorithm (the signal pad has this many per set)

// kAny: the communicator's areas carry the data; kSymmetric: every peer maps the buffers (zero copy).
enum class Buffers { kAny, kSymmetric };

struct Choice {
  Algorithm algorithm;
  int blocks;
};

// A row whose gate is closed does not apply; a forced protocol whose gate is closed runs pipelined (multicast:
// the table's choice). Neither lands on LL, so LL never depends on the buffers (runs_ll).
struct Gates {
  bool multicast = false;     // the communicator has a multicast region and its kernels serve the call
  bool copy_engines = false;  // the engines reach the peers' buffers (copy_engine.hpp) or pipeline areas
  bool ll_fits = true;        // one LL launch carries the call (all-to-all: a rank block fits an LL slot)
  bool ll128 = true;          // every GPU pair delivers a 128-byte line whole (NVLink); agreed at init
};

// `bytes`: the size as nccl-tests counts it (all-reduce: the buffer; all-gather: the output; reduce-scatter,
// all-to-all: the input); all-to-all-v ignores it (its sizes differ between ranks, its launch width must not).
// `override_text`: BRAID_ALGO's value, "" for none.
Choice select_algorithm(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
                        Buffers buffers = Buffers::kAny, Gates gates = {});

// Whether an eager call whose buffers are announced (BRAID_EAGER_ZERO_COPY) takes the announcing kernel at this
// size: where its zero copy beat the staged paths (kAnnouncedSizes). `bytes` as above; the same on every rank.
bool announcing_pays(Collective collective, size_t bytes);
// Whether an eager call under BRAID_EAGER_ZERO_COPY gathers every rank's announcement of a buffer of `bytes` on the
// host, so that the copy engines can serve it where every rank's buffer is exposed (NOTE [exchanged sizes]).
bool exchanging_pays(Collective collective, size_t bytes);
// Whether an all-to-all in place on 2 ranks whose buffers the peer maps takes the copy engines' swap where the
// table names the copy engines: beyond 64 MiB of input, or at any size where `override_text` (BRAID_ALGO) names
// them for all-to-all (NOTE [in-place swap sizes]).
bool in_place_swap_pays(size_t bytes, const std::string& override_text);
// Tests only (testing::announce_at_every_size): every size beyond LL announces, on every rank of the process.
void set_announce_at_every_size(bool on);

// Whether the call runs LL or LL128. Those rows serve every buffer kind (tests/cpu/test_selection.cpp), so ranks
// agree on LL from the call alone and an LL call looks up no buffer. `gates.copy_engines` plays no part.
bool runs_ll(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
             Gates gates = {});

}  // namespace braid

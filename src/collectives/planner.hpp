// The planner: turns a call (collective, size, world size, datatype) and what the lookups found about its buffers
// into the one plan the CUDA backend launches: the protocol, the buffer mode, the launch width and the chunk one
// launch carries. Every rule that decides how a call runs lives here or in the selection table under it
// (selection.hpp); the launch code (collectives.cpp, all_to_all.cpp) follows the plan and changes nothing.
//
// Two words say how a call runs:
//   - the protocol (`Algorithm`: LL, one shot, two shot, pipelined, staged, copy engine, multicast): how the
//     data moves between the GPUs;
//   - the buffer mode (`BufferMode`): whether the kernels read or write the peers' own buffers in place (zero
//     copy, on buffers every peer maps), or the data passes through the communicator's own areas (staging, the
//     pipeline FIFOs, the LL lines, the multicast region).
//
// Every input is the same on every rank that makes the same call with the same kind of buffers, so every rank
// plans alike; where a rank does not, the plan words its barriers compare differ (plan.hpp) and the call fails
// with kMismatch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/selection.hpp"

namespace braid::collectives {

enum class BufferMode { kStagedCopy, kZeroCopy };
const char* buffer_mode_name(BufferMode mode);  // "staged copy", "zero copy"

// What every rank knows of a call before any buffer is looked up.
struct CallShape {
  Collective collective;
  size_t bytes;  // the collective's size as the table counts it (selection.hpp)
  int world;
  DataType type;
  const std::string* algorithm_override;  // BRAID_ALGO's value, "" for none; never null
  bool multicast;  // the communicator has a multicast region and its kernels serve this call (multicast_launch.hpp)
  int max_blocks = kMaxBlocks;  // the communicator's cap on a launch's blocks (CommOptions::max_blocks)
  bool ll128 = true;  // every pair of the communicator's GPUs delivers a 128-byte line whole (selection.hpp, Gates)
};

// How much one launch can carry through the communicator's areas, in bytes.
struct AreaCapacities {
  size_t staging_half;    // one half of the staging area (staged kernels alternate halves)
  size_t ll_payload;      // payload an LL launch carries from each sender (its slot, less the flags)
  size_t multicast_half;  // one half of the multicast region (0 without one)
  size_t ll128_payload;   // payload an LL128 launch carries from each sender
  size_t send_recv_lines_payload = 0;  // a send/recv message in LL128 lines, at most (0: no area for them)
};

// What the lookups found about the call's buffers; every fact holds for every rank's buffers, so it is the same
// on every rank.
struct BufferFacts {
  // Every peer maps the buffers the zero-copy kernels use, at offsets they can load and store whole vectors
  // from: all-reduce, all-to-all, both buffers; reduce-scatter, the input; all-gather and broadcast, the output.
  bool peers_map = false;
  // Reduce-scatter: every peer maps the output too, where the copy engines push the peer's block
  // (copy_engine.hpp).
  bool peers_map_output = false;
  // Some peer's buffer the copy engines would use (reduce-scatter: the output) is another GPU's cudaMalloc memory
  // of this process (PeerRange::same_process_peers): copy engines do not serve it (copy_engine.hpp).
  bool same_process_peers = false;
  // The input and output overlap (in place). An all-to-all in place runs staged, whatever the other facts say.
  bool in_place = false;
};

struct CallPlan {
  Algorithm algorithm;  // the protocol
  BufferMode mode;
  int blocks;  // channels of each launch: the table's width, at most the shape's max_blocks
  // Units (elements; bytes for all-gather and broadcast, whose kernels move bytes) of the call's count one launch
  // carries: the call runs as ceil(count / chunk) launches, each its own call of the protocol. SIZE_MAX: one launch.
  size_t chunk;
};

// Whether the call runs LL lines. LL never depends on the buffers (selection.hpp, runs_ll), so an LL call looks
// up no buffer: callers ask this first and pass no facts then.
bool plans_ll(const CallShape& shape, const AreaCapacities& capacities);

// Whether the call would push into the peers' outputs with copy engines if they mapped them (a reduce-scatter on 2
// ranks beyond the table's cut-off, or forced): only such a call looks up a reduce-scatter's output, so smaller
// ones exchange and map nothing for it. The same answer on every rank: it reads only the call.
bool plans_output_pushes(const CallShape& shape, const AreaCapacities& capacities);

// The plan of a call, for every collective the table holds. `facts`: what the lookups found (none for an LL call).
CallPlan plan_call(const CallShape& shape, const AreaCapacities& capacities, const BufferFacts& facts = {});

}  // namespace braid::collectives

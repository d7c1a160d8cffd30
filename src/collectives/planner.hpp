// The planner: a call and what the lookups found about its buffers make the plan the CUDA backend launches. Every
// rule deciding how a call runs lives here, in selection.hpp or in the protocol registry (protocols.hpp). Every input is the same on every rank making the
// same call with the same kind of buffers; where a rank differs, so do the plan words its barriers compare
// (plan.hpp): kMismatch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/protocols.hpp"
#include "collectives/selection.hpp"

namespace braid::collectives {

// What every rank knows of a call before any buffer is looked up.
struct CallShape {
  Collective collective;
  size_t bytes;  // as the table counts it
  int world;
  DataType type;
  const std::string* algorithm_override;  // BRAID_ALGO's value, "" for none; never null
  bool multicast;  // the communicator has a multicast region and its kernels serve this call
  int max_blocks = kMaxBlocks;  // CommOptions::max_blocks
  bool ll128 = true;  // Gates::ll128
};

// Bytes one launch can carry through the communicator's areas.
struct AreaCapacities {
  size_t staging_half;    // one half of the staging area (staged kernels alternate halves)
  size_t ll_payload;      // from each sender (the slot less the flags)
  size_t multicast_half;  // 0 without a region
  size_t ll128_payload;   // from each sender
  size_t send_recv_lines_payload = 0;  // 0: no area
  size_t copy_engine_slot_payload = 0;  // a send/recv pair's slot in the peer's pipeline area; 0: no slots
  bool copy_engine_window = false;  // the pipeline area holds the contiguous window (kernels::BulkLayout::window_of)
};

// What the lookups found; each fact holds for every rank's buffers, so every rank has the same.
struct BufferFacts {
  // Every peer maps the buffers the zero-copy kernels use, 16-byte aligned: all-reduce, all-to-all, both;
  // reduce-scatter, the input; all-gather and broadcast, the output.
  bool peers_map = false;
  bool peers_map_output = false;    // reduce-scatter: the output too, for the copy engines' pushes
  bool same_process_peers = false;  // one the engines would use is another GPU's cudaMalloc memory of this process
  bool in_place = false;            // an all-to-all in place: zero copy only by the engines' swap of 2 ranks
  bool one_sided = false;           // the global-memory all-to-all: loads or pulls from the peers, never LL
  // An eager call under BRAID_EAGER_ZERO_COPY whose buffers no peer maps otherwise: its kernel learns at its entry
  // barrier where every rank's lies (NOTE [announced calls], planner.cpp). The same on every rank: it depends on
  // the call and the agreed switch, never on this rank's buffers.
  bool announced = false;
};

struct CallPlan {
  const Protocol* protocol;  // its row in the registry, never null
  Algorithm algorithm;       // protocol->algorithm
  BufferMode mode;           // protocol->mode
  int blocks;  // the table's width, at most max_blocks
  // Units (elements; bytes for all-gather and broadcast) one launch carries by the row's chunk rule:
  // ceil(count / chunk) launches, each its own call of the protocol. SIZE_MAX: one launch.
  size_t chunk;
};

// Whether the call runs LL (selection.hpp, runs_ll): callers ask first, and look up no buffer for an LL call.
bool plans_ll(const CallShape& shape, const AreaCapacities& capacities);

// Whether a reduce-scatter would push into the peers' outputs with copy engines if they mapped them: only then is
// its output looked up. Reads only the call, so the same on every rank.
bool plans_output_pushes(const CallShape& shape, const AreaCapacities& capacities);

// `facts`: none for an LL call. kInternal where the table names a protocol with no row the buffers allow.
CallPlan plan_call(const CallShape& shape, const AreaCapacities& capacities, const BufferFacts& facts = {});

}  // namespace braid::collectives

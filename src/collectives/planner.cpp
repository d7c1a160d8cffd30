#include "collectives/planner.hpp"

#include <algorithm>
#include <cstdint>

#include "core/error.hpp"

namespace braid::collectives {
namespace {

// The table's buffer key. Broadcast's only zero-copy path is the engines' pushes, which same-process peers do
// not take.
Buffers table_key(Collective collective, const BufferFacts& facts) {
  switch (collective) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kAllToAll: return facts.peers_map ? Buffers::kSymmetric : Buffers::kAny;
    case Collective::kBroadcast:
      return facts.peers_map && !facts.same_process_peers ? Buffers::kSymmetric : Buffers::kAny;
    default: return Buffers::kAny;
  }
}

BufferMode mode_of(Collective collective, Algorithm algorithm, const BufferFacts& facts) {
  if (collective == Collective::kReduceScatter && algorithm == Algorithm::kCopyEngine) {
    // Pushes into the peer's output where it maps it, else pairs through its pipeline area.
    return facts.peers_map_output && !facts.same_process_peers && !facts.in_place ? BufferMode::kZeroCopy
                                                                                   : BufferMode::kStagedCopy;
  }
  if (!facts.peers_map) return BufferMode::kStagedCopy;
  switch (collective) {
    case Collective::kAllReduce:
      // The one shot stages: in place it needs an exit barrier, and lost everywhere (docs/dev/selection.md).
      return algorithm == Algorithm::kTwoShot || algorithm == Algorithm::kCopyEngine ? BufferMode::kZeroCopy
                                                                                        : BufferMode::kStagedCopy;
    case Collective::kReduceScatter:
      return algorithm == Algorithm::kPipelined ? BufferMode::kZeroCopy : BufferMode::kStagedCopy;
    case Collective::kAllGather:
    case Collective::kAllToAll:
      return algorithm == Algorithm::kPipelined || algorithm == Algorithm::kCopyEngine ? BufferMode::kZeroCopy
                                                                                          : BufferMode::kStagedCopy;
    case Collective::kBroadcast:
      return algorithm == Algorithm::kCopyEngine ? BufferMode::kZeroCopy : BufferMode::kStagedCopy;
    default: return BufferMode::kStagedCopy;
  }
}

// Zero copy, the FIFOs and the copy engines stream the whole call through one launch.
size_t chunk_of(const CallShape& shape, Algorithm algorithm, const AreaCapacities& capacities) {
  const size_t size = datatype_size(shape.type);
  const bool moves_bytes = shape.collective == Collective::kAllGather || shape.collective == Collective::kBroadcast;
  const size_t unit = moves_bytes ? 1 : size;
  if (shape.collective == Collective::kAllToAll || shape.collective == Collective::kAllToAllv) return SIZE_MAX;
  switch (algorithm) {
    case Algorithm::kLL: return capacities.ll_payload / unit;
    case Algorithm::kLL128: return capacities.ll128_payload / unit;
    case Algorithm::kMulticast:
      // All-gather: every rank's block of a chunk in the half, in whole 16-byte vectors.
      if (shape.collective == Collective::kAllGather) return capacities.multicast_half / shape.world / 16 * 16;
      return capacities.multicast_half / unit;
    case Algorithm::kOneShot:
    case Algorithm::kStaged:
    case Algorithm::kSplit:
      // Reduce-scatter: every rank's block of the chunk in the half, each rounded up to 256 bytes.
      if (shape.collective == Collective::kReduceScatter) {
        const size_t per_rank = capacities.staging_half / shape.world;
        return per_rank > 256 ? (per_rank - 256) / unit : 0;
      }
      return capacities.staging_half / unit;
    default: return SIZE_MAX;
  }
}

bool moves_pairs(Collective collective, int world, const BufferFacts& facts) {
  switch (collective) {
    case Collective::kAllToAll: return !facts.in_place;  // its pairs would read blocks its receives overwrite
    case Collective::kAllGather:
    case Collective::kBroadcast: return true;
    case Collective::kReduceScatter:
    case Collective::kReduce: return world == 2;  // one peer's data completes the output
    default: return false;
  }
}

Gates gates_of(const CallShape& shape, const AreaCapacities& capacities, const BufferFacts& facts) {
  Gates gates{};
  gates.multicast = shape.multicast;
  // Into the peers' buffers where they all map them, else as pairs into their pipeline areas. Reduce-scatter and
  // reduce: 2 ranks, any buffer (the plan's mode picks pushes or pairs).
  if (shape.collective == Collective::kReduceScatter || shape.collective == Collective::kReduce) {
    gates.copy_engines = moves_pairs(shape.collective, shape.world, facts);
  } else if (shape.collective == Collective::kAllReduce) {  // pushes into the peer's output: 2 ranks, out of place
    gates.copy_engines = facts.peers_map && !facts.same_process_peers && !facts.in_place && shape.world == 2;
  } else {
    gates.copy_engines =
        facts.peers_map ? !facts.same_process_peers : moves_pairs(shape.collective, shape.world, facts);
  }
  gates.ll_fits = shape.collective != Collective::kAllToAll || shape.bytes / shape.world <= capacities.ll_payload;
  gates.ll128 = shape.ll128;
  if (shape.collective == Collective::kSendRecv) {  // the pair's message fits its slot of lines
    gates.ll128 = gates.ll128 && capacities.send_recv_lines_payload != 0 && shape.bytes <= capacities.send_recv_lines_payload;
  }
  return gates;
}

// An all-to-all in place runs staged whatever its buffers: its zero-copy kernels and copy engines would write a
// peer's output while that peer still reads the same bytes as its input.
BufferFacts usable_facts(Collective collective, BufferFacts facts) {
  if (collective == Collective::kAllToAll && facts.in_place) facts.peers_map = facts.same_process_peers = false;
  return facts;
}

}  // namespace

const char* buffer_mode_name(BufferMode mode) {
  return mode == BufferMode::kZeroCopy ? "zero copy" : "staged copy";
}

bool plans_ll(const CallShape& shape, const AreaCapacities& capacities) {
  return runs_ll(shape.collective, shape.bytes, shape.world, shape.type, *shape.algorithm_override,
                 gates_of(shape, capacities, {}));
}

bool plans_output_pushes(const CallShape& shape, const AreaCapacities& capacities) {
  if (shape.collective != Collective::kReduceScatter || plans_ll(shape, capacities)) return false;
  for (const bool input_mapped : {false, true}) {
    BufferFacts facts{};
    facts.peers_map = input_mapped;
    facts.peers_map_output = true;
    const CallPlan plan = plan_call(shape, capacities, facts);
    if (plan.algorithm == Algorithm::kCopyEngine && plan.mode == BufferMode::kZeroCopy) return true;
  }
  return false;
}

CallPlan plan_call(const CallShape& shape, const AreaCapacities& capacities, const BufferFacts& call_facts) {
  const BufferFacts facts = usable_facts(shape.collective, call_facts);
  const Gates gates = gates_of(shape, capacities, facts);
  const Choice choice = select_algorithm(shape.collective, shape.bytes, shape.world, shape.type,
                                         *shape.algorithm_override, table_key(shape.collective, facts), gates);
  CallPlan plan{};
  plan.algorithm = choice.algorithm;
  plan.mode = mode_of(shape.collective, choice.algorithm, facts);
  plan.blocks = std::min(choice.blocks, shape.max_blocks);
  plan.chunk = chunk_of(shape, choice.algorithm, capacities);
  if (plan.chunk == 0) {
    raise(ErrorCode::kInternal, "{}: the communicator's {} area holds less than one element of {}",
          collective_name(static_cast<unsigned int>(shape.collective)), algorithm_name(choice.algorithm),
          datatype_name(shape.type));
  }
  return plan;
}

}  // namespace braid::collectives

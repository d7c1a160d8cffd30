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

bool needs_met(Needs needs, const BufferFacts& facts) {
  switch (needs) {
    case Needs::kNothing: return true;
    case Needs::kPeersMap: return facts.peers_map;
    case Needs::kPeersMapOutput: return facts.peers_map_output && !facts.same_process_peers && !facts.in_place;
    case Needs::kPeersMapInPlace: return facts.peers_map && !facts.same_process_peers && facts.in_place;
    case Needs::kAnnouncedBuffers: return facts.announced;
  }
  return false;
}

// NOTE [announced calls]
// A call with BufferFacts::announced takes its collective's announcing row at the sizes where it pays (NOTE
// [announced sizes], selection.cpp), whatever protocol the table names there beyond LL and LL128 (which never
// depend on the buffers), with the width the table gives buffers the peers map: its kernel is zero copy where
// every rank announces an exposed buffer, and stages inside itself otherwise. Elsewhere the call plans as a
// staged one. Both depend on the call's shape alone, so every rank plans alike. Its plan word differs from every
// other row's (plan.hpp), so a rank that runs another kernel fails the call with kMismatch on every rank.
const Protocol* announced_row(Collective collective) {
  for (const Protocol& row : protocols()) {
    if (row.collective == collective && row.mode == BufferMode::kAnnounced) return &row;
  }
  return nullptr;
}

// The row of (collective, algorithm) the buffers and the world allow, zero copy before staged (protocols.cpp lists
// it first).
const Protocol* row_for(Collective collective, Algorithm algorithm, const BufferFacts& facts, int world) {
  for (const Protocol& row : protocols()) {
    if (row.collective == collective && row.algorithm == algorithm && needs_met(row.needs, facts) &&
        serves_world(row.worlds, world)) {
      return &row;
    }
  }
  raise(ErrorCode::kInternal, "{}: the protocol {} has no row for these buffers on {} rank(s)",
        collective_name(static_cast<unsigned int>(collective)), algorithm_name(algorithm), world);
}

size_t chunk_of(const CallShape& shape, ChunkRule rule, const AreaCapacities& capacities) {
  const bool moves_bytes = shape.collective == Collective::kAllGather || shape.collective == Collective::kBroadcast;
  const size_t unit = moves_bytes ? 1 : datatype_size(shape.type);
  switch (rule) {
    case ChunkRule::kWholeCall: return SIZE_MAX;
    case ChunkRule::kLLPayload: return capacities.ll_payload / unit;
    case ChunkRule::kLL128Payload: return capacities.ll128_payload / unit;
    case ChunkRule::kMulticastHalf: return capacities.multicast_half / unit;
    case ChunkRule::kMulticastHalfPerRank: return capacities.multicast_half / shape.world / 16 * 16;
    case ChunkRule::kStagingHalf: return capacities.staging_half / unit;
    case ChunkRule::kStagingHalfPerRank: {
      const size_t per_rank = capacities.staging_half / shape.world;
      return per_rank > 256 ? (per_rank - 256) / unit : 0;
    }
  }
  return 0;
}

bool moves_pairs(Collective collective, const BufferFacts& facts) {
  switch (collective) {
    case Collective::kAllToAll: return !facts.in_place;  // its pairs would read blocks its receives overwrite
    case Collective::kAllGather:
    case Collective::kBroadcast: return true;
    default: return false;
  }
}

Gates gates_of(const CallShape& shape, const AreaCapacities& capacities, const BufferFacts& facts) {
  Gates gates{};
  gates.multicast = shape.multicast;
  // Into the peers' buffers where they all map them, else as pairs into their pipeline areas. Reduce-scatter: on
  // 2 ranks pushes into the peer's output where every peer maps it, else pairs; on more, pairs on any buffer (the
  // pushes serve 2 ranks, and only there is the output looked up: plans_output_pushes). Reduce: pairs. Whatever
  // the rule, the gate stays shut on a world no copy-engine row of the collective serves (one rank: none).
  // All-reduce: on 2 ranks pushes into the peer's output where the peer maps it (in place, the first pushes go as
  // pairs: NOTE [all-reduce in place by the copy engines]); on more, a reduce-scatter's pairs and then an
  // all-gather's, on any buffer.
  if (shape.collective == Collective::kReduceScatter) {
    gates.copy_engines = shape.world == 2 || !facts.peers_map_output;
  } else if (shape.collective == Collective::kReduce) {
    gates.copy_engines = true;  // pairs, where one peer's data completes the output (its row: 2 ranks)
  } else if (shape.collective == Collective::kAllReduce) {
    gates.copy_engines = shape.world != 2 || (facts.peers_map && !facts.same_process_peers &&
                                              (!facts.in_place || capacities.copy_engine_window));
  } else {
    gates.copy_engines =
        facts.peers_map ? !facts.same_process_peers : moves_pairs(shape.collective, facts);
  }
  gates.copy_engines = gates.copy_engines && some_row_serves(shape.collective, Algorithm::kCopyEngine, shape.world);
  gates.ll_fits = !facts.one_sided &&
                  (shape.collective != Collective::kAllToAll || shape.bytes / shape.world <= capacities.ll_payload);
  gates.ll128 = shape.ll128;
  if (shape.collective == Collective::kSendRecv) {  // the pair's message fits its slot of lines; the engines' slots exist
    gates.ll128 = gates.ll128 && capacities.send_recv_lines_payload != 0 && shape.bytes <= capacities.send_recv_lines_payload;
    gates.copy_engines = gates.copy_engines && capacities.copy_engine_slot_payload != 0;
  }
  return gates;
}

// An all-to-all in place: its zero-copy kernels and the engines' pushes would write a peer's output while that
// peer still reads the same bytes as its input. Only the engines' swap of 2 ranks serves it zero copy (NOTE
// [all-to-all in place by the copy engines], copy_engine.cpp), on buffers the peer maps other than another GPU's
// cudaMalloc memory of this process, at the sizes where it pays (NOTE [in-place swap sizes], selection.cpp); every
// other plan runs as on buffers no peer maps (staged_in_place).
bool swaps_in_place(const CallShape& shape, const BufferFacts& facts) {
  return shape.collective == Collective::kAllToAll && facts.in_place && shape.world == 2 && facts.peers_map &&
         !facts.same_process_peers && in_place_swap_pays(shape.bytes, *shape.algorithm_override);
}

BufferFacts staged_in_place(BufferFacts facts) {
  facts.peers_map = facts.same_process_peers = false;
  return facts;
}

BufferFacts usable_facts(const CallShape& shape, const BufferFacts& facts) {
  const bool staged = shape.collective == Collective::kAllToAll && facts.in_place && !swaps_in_place(shape, facts);
  return staged ? staged_in_place(facts) : facts;
}

}  // namespace

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

namespace {

// The plan of facts the call may use (usable_facts).
CallPlan plan_from(const CallShape& shape, const AreaCapacities& capacities, BufferFacts facts) {
  facts.announced = facts.announced && announcing_pays(shape.collective, shape.bytes);  // else planned as staged
  const Gates gates = gates_of(shape, capacities, facts);
  const Protocol* announcing = facts.announced ? announced_row(shape.collective) : nullptr;
  const Buffers key = announcing != nullptr ? Buffers::kSymmetric : table_key(shape.collective, facts);
  const Choice choice = select_algorithm(shape.collective, shape.bytes, shape.world, shape.type,
                                         *shape.algorithm_override, key, gates);
  if (choice.algorithm == Algorithm::kLL || choice.algorithm == Algorithm::kLL128) announcing = nullptr;
  CallPlan plan{};
  plan.protocol = announcing != nullptr ? announcing : row_for(shape.collective, choice.algorithm, facts, shape.world);
  plan.algorithm = plan.protocol->algorithm;
  plan.mode = plan.protocol->mode;
  plan.blocks = std::min(choice.blocks, shape.max_blocks);
  plan.chunk = chunk_of(shape, plan.protocol->chunk, capacities);
  if (plan.chunk == 0) {
    raise(ErrorCode::kInternal, "{}: the communicator's {} area holds less than one element of {}",
          collective_name(static_cast<unsigned int>(shape.collective)), algorithm_name(choice.algorithm),
          datatype_name(shape.type));
  }
  return plan;
}

}  // namespace

CallPlan plan_call(const CallShape& shape, const AreaCapacities& capacities, const BufferFacts& call_facts) {
  const BufferFacts facts = usable_facts(shape, call_facts);
  const CallPlan plan = plan_from(shape, capacities, facts);
  if (swaps_in_place(shape, facts) && plan.protocol->needs != Needs::kPeersMapInPlace) {
    return plan_from(shape, capacities, staged_in_place(facts));  // the table chose no copy engines here
  }
  return plan;
}

}  // namespace braid::collectives

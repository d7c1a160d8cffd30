#include "collectives/protocols.hpp"

#include <iterator>

#include "collectives/launches.hpp"

namespace braid::collectives {
namespace {

using enum Algorithm;
using enum BufferMode;
using enum Needs;
using enum ChunkRule;
using enum Worlds;
constexpr Collective kAR = Collective::kAllReduce, kR = Collective::kReduce, kRS = Collective::kReduceScatter,
                     kAG = Collective::kAllGather, kBC = Collective::kBroadcast, kA2A = Collective::kAllToAll,
                     kA2Av = Collective::kAllToAllv, kSR = Collective::kSendRecv;

// THE registry. Of the rows of one (collective, protocol), the announced one comes first, then the zero-copy ones
// (the planner takes the first whose needs the buffers meet), then the staged one (NOTE [protocol registry]).
constexpr Protocol kProtocols[] = {
    {kAR, kLL, kStagedCopy, Gate::kLLFits, kNothing, kLLPayload, run_all_reduce_ll},
    {kAR, kLL128, kStagedCopy, Gate::kLL128, kNothing, kLL128Payload, run_all_reduce_ll128},
    {kAR, kOneShot, kStagedCopy, Gate::kOpen, kNothing, kStagingHalf, run_all_reduce_one_shot},
    {kAR, kTwoShot, kAnnounced, Gate::kOpen, kAnnouncedBuffers, kWholeCall, run_all_reduce_announced},
    {kAR, kTwoShot, kZeroCopy, Gate::kOpen, kPeersMap, kWholeCall, run_all_reduce_two_shot_zero_copy},
    {kAR, kTwoShot, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, run_all_reduce_two_shot},
    {kAR, kCopyEngine, kZeroCopy, Gate::kCopyEngines, kPeersMap, kWholeCall, run_all_reduce_copy_engine, kTwo},
    {kAR, kCopyEngine, kStagedCopy, Gate::kCopyEngines, kNothing, kWholeCall, run_all_reduce_copy_engine_pairs,
     kMoreThanTwo},
    {kAR, kMulticast, kStagedCopy, Gate::kMulticast, kNothing, kMulticastHalf, run_reduce_multicast},

    {kR, kLL, kStagedCopy, Gate::kLLFits, kNothing, kLLPayload, run_reduce_ll},
    {kR, kCopyEngine, kStagedCopy, Gate::kCopyEngines, kNothing, kWholeCall, run_reduce_copy_engine_pairs, kTwo},
    {kR, kPipelined, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, run_reduce_pipelined},
    {kR, kTwoShot, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, run_reduce_two_shot},
    {kR, kMulticast, kStagedCopy, Gate::kMulticast, kNothing, kMulticastHalf, run_reduce_multicast},
    {kR, kStaged, kStagedCopy, Gate::kOpen, kNothing, kStagingHalf, run_reduce_staged},
    {kR, kSplit, kStagedCopy, Gate::kOpen, kNothing, kStagingHalf, run_reduce_split},

    {kRS, kLL, kStagedCopy, Gate::kLLFits, kNothing, kLLPayload, run_reduce_scatter_ll},
    {kRS, kStaged, kStagedCopy, Gate::kOpen, kNothing, kStagingHalfPerRank, run_reduce_scatter_staged},
    {kRS, kPipelined, kAnnounced, Gate::kOpen, kAnnouncedBuffers, kWholeCall, run_reduce_scatter_announced},
    {kRS, kPipelined, kZeroCopy, Gate::kOpen, kPeersMap, kWholeCall, run_reduce_scatter_zero_copy},
    {kRS, kPipelined, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, run_reduce_scatter_pipelined},
    {kRS, kCopyEngine, kZeroCopy, Gate::kCopyEngines, kPeersMapOutput, kWholeCall, run_reduce_scatter_copy_engine,
     kTwo},
    {kRS, kCopyEngine, kStagedCopy, Gate::kCopyEngines, kNothing, kWholeCall, run_reduce_scatter_copy_engine_pairs,
     kTwoOrMore},

    {kAG, kLL, kStagedCopy, Gate::kLLFits, kNothing, kLLPayload, run_all_gather_ll},
    {kAG, kMulticast, kStagedCopy, Gate::kMulticast, kNothing, kMulticastHalfPerRank, run_all_gather_multicast},
    {kAG, kStaged, kStagedCopy, Gate::kOpen, kNothing, kStagingHalf, run_all_gather_staged},
    {kAG, kPipelined, kAnnounced, Gate::kOpen, kAnnouncedBuffers, kWholeCall, run_all_gather_announced},
    {kAG, kPipelined, kZeroCopy, Gate::kOpen, kPeersMap, kWholeCall, run_all_gather_zero_copy},
    {kAG, kPipelined, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, run_all_gather_pipelined},
    {kAG, kCopyEngine, kZeroCopy, Gate::kCopyEngines, kPeersMap, kWholeCall, run_all_gather_copy_engine},
    {kAG, kCopyEngine, kStagedCopy, Gate::kCopyEngines, kNothing, kWholeCall, run_all_gather_copy_engine_pairs},

    {kBC, kLL, kStagedCopy, Gate::kLLFits, kNothing, kLLPayload, run_broadcast_ll},
    {kBC, kStaged, kStagedCopy, Gate::kOpen, kNothing, kStagingHalf, run_broadcast_staged},
    {kBC, kSplit, kStagedCopy, Gate::kOpen, kNothing, kStagingHalf, run_broadcast_split},
    {kBC, kPipelined, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, run_broadcast_pipelined},
    {kBC, kCopyEngine, kZeroCopy, Gate::kCopyEngines, kPeersMap, kWholeCall, run_broadcast_copy_engine},
    {kBC, kCopyEngine, kStagedCopy, Gate::kCopyEngines, kNothing, kWholeCall, run_broadcast_copy_engine_pairs},

    {kA2A, kLL, kStagedCopy, Gate::kLLFits, kNothing, kWholeCall, run_all_to_all_ll},
    {kA2A, kPipelined, kAnnounced, Gate::kOpen, kAnnouncedBuffers, kWholeCall, run_all_to_all_announced},
    {kA2A, kPipelined, kZeroCopy, Gate::kOpen, kPeersMap, kWholeCall, run_all_to_all_direct},
    {kA2A, kPipelined, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, run_all_to_all_pipelined},
    {kA2A, kCopyEngine, kZeroCopy, Gate::kCopyEngines, kPeersMapInPlace, kWholeCall, run_all_to_all_copy_engine_swap,
     kTwo},
    {kA2A, kCopyEngine, kZeroCopy, Gate::kCopyEngines, kPeersMap, kWholeCall, run_all_to_all_copy_engine},
    {kA2A, kCopyEngine, kStagedCopy, Gate::kCopyEngines, kNothing, kWholeCall, run_all_to_all_copy_engine_pairs},

    // Launched by their pairs (send_recv.cpp, all_to_all.cpp).
    {kA2Av, kPipelined, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, nullptr},
    {kSR, kLL128, kStagedCopy, Gate::kLL128, kNothing, kLL128Payload, nullptr},
    {kSR, kPipelined, kStagedCopy, Gate::kOpen, kNothing, kWholeCall, nullptr},
    {kSR, kCopyEngine, kStagedCopy, Gate::kCopyEngines, kNothing, kWholeCall, nullptr},
};

}  // namespace

const char* buffer_mode_name(BufferMode mode) {
  switch (mode) {
    case kZeroCopy: return "zero copy";
    case kAnnounced: return "announced";
    case kStagedCopy: break;
  }
  return "staged copy";
}

bool serves_world(Worlds worlds, int world) {
  switch (worlds) {
    case Worlds::kAny: return true;
    case Worlds::kTwo: return world == 2;
    case Worlds::kTwoOrMore: return world >= 2;
    case Worlds::kMoreThanTwo: return world > 2;
  }
  return false;
}

bool some_row_serves(Collective collective, Algorithm algorithm, int world) {
  for (const Protocol& row : kProtocols) {
    if (row.collective == collective && row.algorithm == algorithm && serves_world(row.worlds, world)) return true;
  }
  return false;
}

bool gate_open(Gate gate, const Gates& gates) {
  switch (gate) {
    case Gate::kOpen: return true;
    case Gate::kMulticast: return gates.multicast;
    case Gate::kCopyEngines: return gates.copy_engines;
    case Gate::kLLFits: return gates.ll_fits;
    case Gate::kLL128: return gates.ll128;
  }
  return false;
}

std::span<const Protocol> protocols() { return {std::begin(kProtocols), std::end(kProtocols)}; }

const Protocol* find_protocol(Collective collective, Algorithm algorithm) {
  for (const Protocol& row : kProtocols) {
    if (row.collective == collective && row.algorithm == algorithm) return &row;
  }
  return nullptr;
}

Gate gate_of(Collective collective, Algorithm algorithm) {
  const Protocol* row = find_protocol(collective, algorithm);
  return row == nullptr ? Gate::kOpen : row->gate;
}

}  // namespace braid::collectives

// The planner (collectives/planner.hpp): what the buffers allow decides the protocol and the buffer mode in one
// place, and the chunks follow the communicator's areas. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "braid/types.hpp"
#include "collectives/planner.hpp"
#include "collectives/protocols.hpp"
#include "collectives/selection.hpp"
#include "core/error.hpp"

namespace braid::collectives {
namespace {

const std::string kNoOverride;

// The default areas of a 2-rank communicator: 16 MiB staging halves, a 1 MiB LL payload a sender, no multicast, no
// send/recv lines, 8 MiB copy-engine slots.
constexpr AreaCapacities kAreas{size_t(16) << 20, size_t(1) << 20, 0, size_t(1) << 20, 0, size_t(8) << 20, true};

CallShape shape(Collective collective, size_t bytes, int world = 2, DataType type = DataType::kFloat32,
                const std::string* algorithm_override = &kNoOverride) {
  return CallShape{collective, bytes, world, type, algorithm_override, false};
}

BufferFacts mapped(bool same_process_peers = false, bool in_place = false) {
  return BufferFacts{.peers_map = true, .same_process_peers = same_process_peers, .in_place = in_place};
}

TEST(Planner, CopyEnginesOnlyWhereTheyReachEveryPeer) {
  const CallShape large = shape(Collective::kAllGather, size_t(512) << 20);
  const CallPlan pushes = plan_call(large, kAreas, mapped());
  EXPECT_EQ(pushes.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(pushes.mode, BufferMode::kZeroCopy);
  // Another GPU's cudaMalloc memory of this process: the zero-copy stores instead.
  const CallPlan stores = plan_call(large, kAreas, mapped(true));
  EXPECT_EQ(stores.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(stores.mode, BufferMode::kZeroCopy);
  // Buffers peers cannot map: copy-engine pairs through the peers' pipeline areas on 2 ranks, FIFO pushes through
  // them on more.
  const CallPlan pairs = plan_call(large, kAreas, {});
  EXPECT_EQ(pairs.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(pairs.mode, BufferMode::kStagedCopy);
  EXPECT_EQ(pairs.chunk, SIZE_MAX);
  const CallPlan fifo = plan_call(shape(Collective::kAllGather, size_t(512) << 20, 4), kAreas, {});
  EXPECT_EQ(fifo.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(fifo.mode, BufferMode::kStagedCopy);
  EXPECT_EQ(fifo.chunk, SIZE_MAX);

  const std::string forced = "broadcast=copyengine";
  const CallShape broadcast = shape(Collective::kBroadcast, size_t(1) << 20, 2, DataType::kFloat32, &forced);
  EXPECT_EQ(plan_call(broadcast, kAreas, mapped()).algorithm, Algorithm::kCopyEngine);
  const CallPlan not_reachable = plan_call(broadcast, kAreas, mapped(true));
  EXPECT_EQ(not_reachable.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(not_reachable.mode, BufferMode::kStagedCopy);  // broadcast has no zero-copy kernel but the pushes
}

// All-reduce's copy engines: on 2 ranks the pushes into the peer's output (where the peer maps it, in place too),
// else the table's choice; on more, the pairs on any buffer, mapped or not, in place or not.
TEST(Planner, AllReduceCopyEnginesArePushesOnTwoRanksAndPairsOnMore) {
  const std::string forced = "allreduce=copyengine";
  const CallShape two = shape(Collective::kAllReduce, size_t(64) << 20, 2, DataType::kFloat32, &forced);
  const CallPlan pushes = plan_call(two, kAreas, mapped());
  EXPECT_EQ(pushes.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(pushes.mode, BufferMode::kZeroCopy);
  EXPECT_NE(plan_call(two, kAreas, {}).algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(plan_call(two, kAreas, mapped(false, true)).algorithm, Algorithm::kCopyEngine);
  EXPECT_NE(plan_call(two, kAreas, mapped(true, true)).algorithm, Algorithm::kCopyEngine);
  for (const int world : {3, 4, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const CallShape more = shape(Collective::kAllReduce, size_t(64) << 20, world, DataType::kFloat32, &forced);
    for (const BufferFacts& facts : {BufferFacts{}, mapped(), mapped(true), mapped(false, true)}) {
      const CallPlan pairs = plan_call(more, kAreas, facts);
      EXPECT_EQ(pairs.algorithm, Algorithm::kCopyEngine);
      EXPECT_EQ(pairs.mode, BufferMode::kStagedCopy);
      EXPECT_EQ(pairs.chunk, SIZE_MAX);
    }
    EXPECT_NE(plan_call(shape(Collective::kAllReduce, size_t(64) << 20, world), kAreas, {}).algorithm,
              Algorithm::kCopyEngine) << "the table does not take them";
  }
}

// NOTE [announced calls]: an announced all-gather, reduce-scatter, all-reduce or all-to-all takes its announcing row where
// it pays (NOTE [announced sizes]) whatever the table or BRAID_ALGO names, on every world, and plans as a staged
// call elsewhere; LL stays LL; collectives without an announcing row plan as they would.
TEST(Planner, AnnouncedCallsTakeTheAnnouncingRowWhereItPays) {
  const BufferFacts announced{.announced = true};
  struct Case {
    Collective collective;
    std::string forced;
    Algorithm row;
    size_t first, last;  // the announced sizes
  };
  const Case cases[] = {
      {Collective::kAllGather, "allgather=copyengine", Algorithm::kPipelined, size_t(8) << 20, SIZE_MAX},
      {Collective::kReduceScatter, "reducescatter=copyengine", Algorithm::kPipelined, size_t(16) << 20,
       size_t(256) << 20},
      {Collective::kAllReduce, "allreduce=oneshot", Algorithm::kTwoShot, size_t(8) << 20, size_t(128) << 20},
      {Collective::kAllToAll, "alltoall=copyengine", Algorithm::kPipelined, size_t(4) << 20, size_t(128) << 20}};
  for (const Case& c : cases) {
    for (const int world : {2, 3, 8}) {
      SCOPED_TRACE(std::string(collective_name(static_cast<unsigned int>(c.collective))) + ", world " +
                   std::to_string(world));
      for (const size_t bytes : {size_t(4) << 20, c.first - 16, c.first, size_t(64) << 20, c.last, c.last + 16,
                                 size_t(1) << 30}) {
        if (bytes == SIZE_MAX || bytes + 16 == 0) continue;
        const bool pays = bytes >= c.first && bytes <= c.last;
        EXPECT_EQ(announcing_pays(c.collective, bytes), pays) << bytes << " bytes";
        for (const std::string* text : {&kNoOverride, &c.forced}) {
          const CallShape call = shape(c.collective, bytes, world, DataType::kFloat32, text);
          const CallPlan plan = plan_call(call, kAreas, announced);
          if (!pays) {
            const CallPlan staged = plan_call(call, kAreas, {});
            EXPECT_EQ(plan.protocol, staged.protocol) << bytes << " bytes: planned as a staged call";
            continue;
          }
          EXPECT_EQ(plan.mode, BufferMode::kAnnounced) << bytes << " bytes, override '" << *text << "'";
          EXPECT_EQ(plan.algorithm, c.row);
          EXPECT_EQ(plan.chunk, SIZE_MAX);
          EXPECT_GE(plan.blocks, 1);
        }
      }
      const CallPlan small = plan_call(shape(c.collective, 1024, world), kAreas, announced);
      EXPECT_TRUE(small.algorithm == Algorithm::kLL || small.algorithm == Algorithm::kLL128);
      EXPECT_EQ(small.mode, BufferMode::kStagedCopy);
    }
    EXPECT_NE(plan_call(shape(c.collective, size_t(64) << 20), kAreas, {}).mode, BufferMode::kAnnounced);
  }
  EXPECT_FALSE(announcing_pays(Collective::kBroadcast, size_t(64) << 20));
  const CallPlan broadcast = plan_call(shape(Collective::kBroadcast, size_t(64) << 20), kAreas, announced);
  EXPECT_NE(broadcast.mode, BufferMode::kAnnounced) << "broadcast has no announcing row";
}

BufferFacts output_mapped(bool input_mapped, bool same_process_peers = false, bool in_place = false) {
  return BufferFacts{.peers_map = input_mapped, .peers_map_output = true, .same_process_peers = same_process_peers,
                     .in_place = in_place};
}

// Reduce-scatter's copy engines on 2 ranks, any buffer: pushes into the peer's output where the peer maps it, out
// of place and not another GPU's cudaMalloc memory of this process (zero copy, in the plan's words); pairs through
// the peer's pipeline area else (staged). On more ranks pairs only: the output is never looked up there
// (plans_output_pushes), and facts that said every peer maps it would close the gate (the call takes the FIFOs).
TEST(Planner, ReduceScatterCopyEnginesOnTwoRanks) {
  const CallShape large = shape(Collective::kReduceScatter, size_t(512) << 20);
  for (bool input_mapped : {false, true}) {
    const CallPlan pushes = plan_call(large, kAreas, output_mapped(input_mapped));
    EXPECT_EQ(pushes.algorithm, Algorithm::kCopyEngine);
    EXPECT_EQ(pushes.mode, BufferMode::kZeroCopy);
    EXPECT_EQ(pushes.chunk, SIZE_MAX);
  }
  for (const BufferFacts& facts : {mapped(), mapped(true), BufferFacts{}, output_mapped(true, true),
                                   output_mapped(true, false, true), output_mapped(false, false, true)}) {
    const CallPlan pairs = plan_call(large, kAreas, facts);
    EXPECT_EQ(pairs.algorithm, Algorithm::kCopyEngine);
    EXPECT_EQ(pairs.mode, BufferMode::kStagedCopy);
    EXPECT_EQ(pairs.chunk, SIZE_MAX);
  }
  // Beyond 128 MiB where the peers map the input; beyond 64 MiB where they do not.
  const CallShape medium = shape(Collective::kReduceScatter, size_t(128) << 20);
  EXPECT_EQ(plan_call(medium, kAreas, output_mapped(true)).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(medium, kAreas, output_mapped(true)).mode, BufferMode::kZeroCopy);  // loads of the inputs
  EXPECT_EQ(plan_call(medium, kAreas, output_mapped(false)).algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(plan_call(medium, kAreas, output_mapped(false)).mode, BufferMode::kZeroCopy);
  EXPECT_EQ(plan_call(shape(Collective::kReduceScatter, (size_t(128) << 20) + 16), kAreas, output_mapped(true)).algorithm,
            Algorithm::kCopyEngine);

  const std::string forced = "reducescatter=copyengine";
  const CallPlan two = plan_call(shape(Collective::kReduceScatter, size_t(1) << 20, 2, DataType::kFloat32, &forced),
                                 kAreas, {});
  EXPECT_EQ(two.algorithm, Algorithm::kCopyEngine);
  const CallPlan four = plan_call(shape(Collective::kReduceScatter, size_t(1) << 20, 4, DataType::kFloat32, &forced),
                                  kAreas, output_mapped(true));
  EXPECT_EQ(four.algorithm, Algorithm::kPipelined);
  for (const BufferFacts& facts : {BufferFacts{}, mapped(), BufferFacts{.in_place = true}}) {
    const CallPlan pairs = plan_call(shape(Collective::kReduceScatter, size_t(1) << 20, 4, DataType::kFloat32, &forced),
                                     kAreas, facts);
    EXPECT_EQ(pairs.algorithm, Algorithm::kCopyEngine);
    EXPECT_EQ(pairs.mode, BufferMode::kStagedCopy);
  }
}

// One rank: reduce-scatter's copy-engine pairs would reduce the own block into each receive, and a lone rank has
// none, so its calls never take the copy engines, not even forced (the forced one takes the pipelined kernel).
TEST(Planner, ReduceScatterOfOneRankNeverTakesTheCopyEngines) {
  const std::string forced = "reducescatter=copyengine";
  for (const size_t bytes : {size_t(1) << 20, (size_t(64) << 20) + 16, size_t(512) << 20}) {
    for (const std::string* text : {&kNoOverride, &forced}) {
      for (const BufferFacts& facts : {BufferFacts{}, mapped(), output_mapped(false), output_mapped(true),
                                       BufferFacts{.in_place = true}}) {
        SCOPED_TRACE(std::to_string(bytes) + " bytes, BRAID_ALGO '" + *text + "'");
        const CallPlan plan = plan_call(shape(Collective::kReduceScatter, bytes, 1, DataType::kFloat32, text), kAreas,
                                        facts);
        EXPECT_NE(plan.algorithm, Algorithm::kCopyEngine);
        if (text == &forced) EXPECT_EQ(plan.algorithm, Algorithm::kPipelined);
      }
    }
  }
  EXPECT_FALSE(plans_output_pushes(shape(Collective::kReduceScatter, size_t(512) << 20, 1), kAreas));
}

// A reduce-scatter looks its output up only where it may push into it: on 2 ranks beyond the copy-engine cut-off
// (64 MiB of input, or forced), never at LL sizes, on more ranks or for other collectives.
TEST(Planner, OnlyReduceScattersThatMayPushLookUpTheirOutput) {
  EXPECT_FALSE(plans_output_pushes(shape(Collective::kReduceScatter, size_t(64) << 10), kAreas));
  EXPECT_FALSE(plans_output_pushes(shape(Collective::kReduceScatter, size_t(16) << 20), kAreas));
  EXPECT_FALSE(plans_output_pushes(shape(Collective::kReduceScatter, size_t(64) << 20), kAreas));
  EXPECT_TRUE(plans_output_pushes(shape(Collective::kReduceScatter, (size_t(64) << 20) + 16), kAreas));
  EXPECT_TRUE(plans_output_pushes(shape(Collective::kReduceScatter, size_t(512) << 20), kAreas));
  EXPECT_FALSE(plans_output_pushes(shape(Collective::kReduceScatter, size_t(512) << 20, 4), kAreas));
  EXPECT_FALSE(plans_output_pushes(shape(Collective::kAllGather, size_t(512) << 20), kAreas));
  const std::string forced = "reducescatter=copyengine";
  EXPECT_TRUE(plans_output_pushes(
      shape(Collective::kReduceScatter, size_t(4) << 20, 2, DataType::kFloat32, &forced), kAreas));
}

TEST(Planner, TheOneShotAlwaysStages) {
  const std::string forced = "allreduce=oneshot";
  const CallShape call = shape(Collective::kAllReduce, size_t(4) << 20, 2, DataType::kBFloat16, &forced);
  const CallPlan apart = plan_call(call, kAreas, mapped());
  EXPECT_EQ(apart.algorithm, Algorithm::kOneShot);
  EXPECT_EQ(apart.mode, BufferMode::kStagedCopy);
  EXPECT_EQ(apart.chunk, kAreas.staging_half / 2);
  const CallPlan in_place = plan_call(call, kAreas, mapped(false, true));
  EXPECT_EQ(in_place.algorithm, Algorithm::kOneShot);
  EXPECT_EQ(in_place.mode, BufferMode::kStagedCopy);
  EXPECT_EQ(in_place.chunk, kAreas.staging_half / 2);  // bfloat16 elements of a staging half
  EXPECT_EQ(in_place.blocks, apart.blocks);  // the same launch width either way
  // The two shot reads no peer's output: in place is zero copy too.
  EXPECT_EQ(plan_call(shape(Collective::kAllReduce, size_t(64) << 20), kAreas, mapped(false, true)).mode,
            BufferMode::kZeroCopy);
}

// On 2 ranks an all-reduce on buffers the peer maps goes by copy engines beyond 64 MiB: pushes into the peer's
// output (in place, the first ones as pairs into its pipeline area, so only where that has slots), never from
// another GPU's cudaMalloc memory of this process; those calls, and more ranks, keep the zero-copy two shot.
// Buffers no peer maps have no copy-engine all-reduce on 2 ranks.
TEST(Planner, LargeAllReducesOnBuffersThePeerMapsTakeTheCopyEnginesOnTwoRanks) {
  const CallPlan below = plan_call(shape(Collective::kAllReduce, size_t(64) << 20), kAreas, mapped());
  EXPECT_EQ(below.algorithm, Algorithm::kTwoShot);
  EXPECT_EQ(below.mode, BufferMode::kZeroCopy);
  const CallPlan beyond = plan_call(shape(Collective::kAllReduce, (size_t(64) << 20) + 2), kAreas, mapped());
  EXPECT_EQ(beyond.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(beyond.mode, BufferMode::kZeroCopy);
  EXPECT_EQ(beyond.chunk, SIZE_MAX);
  const CallShape large = shape(Collective::kAllReduce, size_t(512) << 20);
  const CallPlan in_place = plan_call(large, kAreas, mapped(false, true));
  EXPECT_EQ(in_place.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(in_place.mode, BufferMode::kZeroCopy);
  AreaCapacities no_window = kAreas;
  no_window.copy_engine_window = false;
  EXPECT_EQ(plan_call(large, no_window, mapped(false, true)).algorithm, Algorithm::kTwoShot);  // in place, no window
  EXPECT_EQ(plan_call(large, no_window, mapped()).algorithm, Algorithm::kCopyEngine);  // out of place needs none
  EXPECT_EQ(plan_call(large, kAreas, mapped(true)).algorithm, Algorithm::kTwoShot);         // same-process peers
  EXPECT_EQ(plan_call(shape(Collective::kAllReduce, size_t(512) << 20, 4), kAreas, mapped()).algorithm,
            Algorithm::kTwoShot);
  EXPECT_EQ(plan_call(large, kAreas, {}).algorithm, Algorithm::kTwoShot);
  EXPECT_EQ(plan_call(large, kAreas, {}).mode, BufferMode::kStagedCopy);
  // Forced where the engines cannot serve: the table's choice.
  const std::string forced = "allreduce=copyengine";
  const CallShape small = shape(Collective::kAllReduce, size_t(1) << 20, 2, DataType::kBFloat16, &forced);
  EXPECT_EQ(plan_call(small, kAreas, mapped()).algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(plan_call(small, kAreas, mapped(false, true)).algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(plan_call(small, kAreas, mapped(true, true)).algorithm, Algorithm::kLL128);
}

// In place, an all-to-all's zero-copy stores and pushes would overwrite blocks peers still read. Where the table
// names the copy engines beyond 64 MiB (or BRAID_ALGO names them at any size) on 2 ranks whose buffers the peer
// maps (not another GPU's cudaMalloc memory of this process), the engines swap the blocks (its own row, a plan
// word of its own); every other call in place plans exactly as on buffers no peer maps: FIFO pushes, or LL lines.
TEST(Planner, AnInPlaceAllToAllRunsZeroCopyOnlyAsTheEnginesSwapOnTwoRanks) {
  const BufferFacts unmapped_in_place{.in_place = true};
  auto same_plan = [](const CallPlan& a, const CallPlan& b) {
    return a.protocol == b.protocol && a.blocks == b.blocks && a.chunk == b.chunk;
  };
  for (size_t bytes : {size_t(16) << 20, size_t(32) << 20, (size_t(32) << 20) + 16, size_t(64) << 20,
                       (size_t(64) << 20) + 16, size_t(512) << 20}) {
    for (int world : {2, 3, 4}) {
      const CallShape call = shape(Collective::kAllToAll, bytes, world);
      const CallPlan apart = plan_call(call, kAreas, mapped());
      EXPECT_EQ(apart.mode, BufferMode::kZeroCopy) << bytes << " on " << world;
      const CallPlan unmapped = plan_call(call, kAreas, unmapped_in_place);
      for (bool same_process : {false, true}) {
        const CallPlan in_place = plan_call(call, kAreas, mapped(same_process, true));
        const bool swaps = world == 2 && !same_process && apart.algorithm == Algorithm::kCopyEngine &&
                           bytes > (size_t(64) << 20);
        if (swaps) {
          EXPECT_EQ(in_place.algorithm, Algorithm::kCopyEngine) << bytes;
          EXPECT_EQ(in_place.mode, BufferMode::kZeroCopy) << bytes;
          EXPECT_EQ(in_place.protocol->needs, Needs::kPeersMapInPlace) << bytes;
          EXPECT_NE(in_place.protocol, apart.protocol) << bytes;
        } else {
          EXPECT_TRUE(same_plan(in_place, unmapped)) << bytes << " on " << world << (same_process ? ", same process" : "");
          EXPECT_EQ(in_place.mode, BufferMode::kStagedCopy) << bytes << " on " << world;
        }
      }
    }
  }
  // The cuts on symmetric buffers on 2 ranks: the pushes beyond 32 MiB out of place, the swap beyond 64 MiB.
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, (size_t(32) << 20) + 16), kAreas, mapped()).algorithm,
            Algorithm::kCopyEngine);
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, size_t(64) << 20), kAreas, mapped(false, true)).algorithm,
            Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, (size_t(64) << 20) + 16), kAreas, mapped(false, true)).algorithm,
            Algorithm::kCopyEngine);
  const std::string forced = "alltoall=copyengine";
  const CallShape call = shape(Collective::kAllToAll, size_t(4) << 20, 2, DataType::kFloat32, &forced);
  const CallPlan swap = plan_call(call, kAreas, mapped(false, true));
  EXPECT_EQ(swap.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(swap.protocol->needs, Needs::kPeersMapInPlace);
  const CallPlan same_process = plan_call(call, kAreas, mapped(true, true));
  EXPECT_EQ(same_process.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(same_process.mode, BufferMode::kStagedCopy);
  const std::string pipelined = "alltoall=pipelined";
  const CallPlan fifo = plan_call(shape(Collective::kAllToAll, size_t(512) << 20, 2, DataType::kFloat32, &pipelined),
                                  kAreas, mapped(false, true));
  EXPECT_EQ(fifo.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(fifo.mode, BufferMode::kStagedCopy);
  // Small sizes take LL lines either way (LL looks at no buffer).
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, size_t(64) << 10), kAreas, mapped(false, true)).algorithm,
            Algorithm::kLL);
}

TEST(Planner, AllToAllTakesLLOnlyWhereABlockFitsTheSlot) {
  const CallShape call = shape(Collective::kAllToAll, size_t(2) << 20);  // a 1 MiB block on 2 ranks
  EXPECT_TRUE(plans_ll(call, kAreas));
  EXPECT_EQ(plan_call(call, kAreas).algorithm, Algorithm::kLL);
  AreaCapacities small_ll = kAreas;
  small_ll.ll_payload = size_t(512) << 10;
  EXPECT_FALSE(plans_ll(call, small_ll));
  const CallPlan fifo = plan_call(call, small_ll, {});
  EXPECT_EQ(fifo.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(fifo.mode, BufferMode::kStagedCopy);
  const CallPlan stores = plan_call(call, small_ll, mapped());
  EXPECT_EQ(stores.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(stores.mode, BufferMode::kZeroCopy);
  // Asked for by name, LL that does not fit runs pipelined too.
  const std::string forced = "alltoall=ll";
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, size_t(2) << 20, 2, DataType::kFloat32, &forced), small_ll).algorithm,
            Algorithm::kPipelined);
}

TEST(Planner, PlansLLExactlyWhenThePlanIsLL) {
  const Collective collectives[] = {Collective::kAllReduce, Collective::kReduce,   Collective::kReduceScatter,
                                    Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll};
  const BufferFacts facts[] = {{}, mapped(), mapped(true), mapped(false, true), mapped(true, true)};
  for (Collective collective : collectives) {
    for (int world : {2, 3, 4, 8}) {
      for (int shift = 10; shift <= 28; ++shift) {
        const CallShape call = shape(collective, (size_t(1) << shift) * world, world);
        const bool ll = plans_ll(call, kAreas);
        for (const BufferFacts& fact : facts) {
          const Algorithm algorithm = plan_call(call, kAreas, fact).algorithm;
          EXPECT_EQ(ll, algorithm == Algorithm::kLL || algorithm == Algorithm::kLL128)
              << collective_name(static_cast<unsigned int>(collective)) << " world " << world << " shift " << shift;
        }
      }
    }
  }
}

TEST(Planner, ChunksFollowTheAreas) {
  // LL: a sender's payload a launch (elements for reductions, bytes for all-gather).
  EXPECT_EQ(plan_call(shape(Collective::kAllReduce, 4096), kAreas).chunk, kAreas.ll_payload / 4);
  EXPECT_EQ(plan_call(shape(Collective::kAllGather, 4096), kAreas).chunk, kAreas.ll_payload);
  // Staged reduce-scatter: every rank's block of a chunk in one half, each rounded up to 256 bytes.
  const std::string staged = "reducescatter=staged";
  const CallPlan reduce_scatter =
      plan_call(shape(Collective::kReduceScatter, size_t(64) << 20, 4, DataType::kFloat32, &staged), kAreas);
  EXPECT_EQ(reduce_scatter.algorithm, Algorithm::kStaged);
  EXPECT_EQ(reduce_scatter.chunk, (kAreas.staging_half / 4 - 256) / 4);
  // Staged all-gather and broadcast move bytes.
  const CallPlan all_gather = plan_call(shape(Collective::kAllGather, size_t(8) << 20), kAreas);
  EXPECT_EQ(all_gather.algorithm, Algorithm::kStaged);
  EXPECT_EQ(all_gather.chunk, kAreas.staging_half);
  // An area too small for one element is an internal error, not an endless loop of empty launches.
  AreaCapacities tiny = kAreas;
  tiny.staging_half = 256;
  EXPECT_THROW(plan_call(shape(Collective::kReduceScatter, size_t(8) << 20, 4, DataType::kFloat32, &staged), tiny),
               Error);
}

TEST(Planner, TheCommunicatorsCapBoundsEveryLaunchWidth) {
  const Collective collectives[] = {Collective::kAllReduce, Collective::kReduce,   Collective::kReduceScatter,
                                    Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll,
                                    Collective::kAllToAllv, Collective::kSendRecv};
  for (Collective collective : collectives) {
    for (size_t bytes : {size_t(8) << 10, size_t(4) << 20, size_t(256) << 20}) {
      CallShape capped = shape(collective, bytes);
      const CallPlan wide = plan_call(capped, kAreas, mapped());
      for (int cap : {1, 3, 64}) {
        capped.max_blocks = cap;
        const CallPlan plan = plan_call(capped, kAreas, mapped());
        EXPECT_EQ(plan.blocks, std::min(wide.blocks, cap)) << collective_name(static_cast<unsigned int>(collective));
        EXPECT_EQ(plan.algorithm, wide.algorithm);  // the cap narrows a launch, it does not change the protocol
      }
    }
  }
}

// A send/recv pair is planned by its own bytes: from 64 MiB the copy engines (into the receiver's pipeline area,
// which every peer maps), below it the FIFO pushes; forced either way by "sendrecv=".
TEST(Planner, SendRecvPairsTakeTheCopyEnginesFrom64MiB) {
  const BufferFacts area = mapped();
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, (size_t(64) << 20) - 1), kAreas, area).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, size_t(64) << 20), kAreas, area).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, (size_t(64) << 20) + 1), kAreas, area).algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, size_t(512) << 20), kAreas, {}).algorithm, Algorithm::kPipelined);
  const std::string fifo = "sendrecv=pipelined", engines = "sendrecv=copyengine";
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, size_t(512) << 20, 2, DataType::kUint8, &fifo), kAreas, area).algorithm,
            Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, size_t(1) << 20, 2, DataType::kUint8, &engines), kAreas, area).algorithm,
            Algorithm::kCopyEngine);
}

// An all-to-all on buffers no peer maps moves its blocks as send/recv's copy-engine pairs into the peers'
// pipeline areas beyond 64 MiB on 2 ranks and beyond 32 MiB on 3-4, out of place only; FIFO pushes below that, in
// place, and on more ranks (not measured there). All-gather and broadcast alike beyond 128 MiB on 2 ranks.
TEST(Planner, LargeCallsOnBuffersNoPeerMapsTakeCopyEnginePairs) {
  const size_t cut = size_t(64) << 20;
  const CallPlan below = plan_call(shape(Collective::kAllToAll, cut), kAreas, {});
  EXPECT_EQ(below.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(below.mode, BufferMode::kStagedCopy);
  const CallPlan beyond = plan_call(shape(Collective::kAllToAll, cut + 16), kAreas, {});
  EXPECT_EQ(beyond.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(beyond.mode, BufferMode::kStagedCopy);  // through the pipeline areas, not the peers' buffers
  EXPECT_EQ(beyond.chunk, SIZE_MAX);
  const BufferFacts in_place{.in_place = true};
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, size_t(512) << 20), kAreas, in_place).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, size_t(32) << 20, 4), kAreas, {}).algorithm, Algorithm::kPipelined);
  const CallPlan four = plan_call(shape(Collective::kAllToAll, (size_t(32) << 20) + 16, 4), kAreas, {});
  EXPECT_EQ(four.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(four.mode, BufferMode::kStagedCopy);
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, size_t(512) << 20, 4), kAreas, in_place).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kAllToAll, size_t(512) << 20, 8), kAreas, {}).algorithm, Algorithm::kPipelined);
  // Buffers peers map stay on their own rows: pushes into the peers' outputs, or, from another GPU's cudaMalloc
  // memory of this process, the direct stores.
  const CallPlan pushes = plan_call(shape(Collective::kAllToAll, size_t(512) << 20), kAreas, mapped());
  EXPECT_EQ(pushes.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(pushes.mode, BufferMode::kZeroCopy);
  const CallPlan stores = plan_call(shape(Collective::kAllToAll, size_t(512) << 20), kAreas, mapped(true));
  EXPECT_EQ(stores.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(stores.mode, BufferMode::kZeroCopy);
  // All-gather and broadcast take the pairs beyond 128 MiB on 2 ranks, in place too (no pair reads what another
  // writes); symmetric broadcasts keep their pushes into the peers' outputs from 32 MiB.
  EXPECT_EQ(plan_call(shape(Collective::kAllGather, size_t(128) << 20), kAreas, {}).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kAllGather, (size_t(128) << 20) + 16), kAreas, in_place).algorithm,
            Algorithm::kCopyEngine);
  EXPECT_EQ(plan_call(shape(Collective::kBroadcast, size_t(128) << 20), kAreas, {}).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kBroadcast, (size_t(128) << 20) + 4), kAreas, in_place).algorithm,
            Algorithm::kCopyEngine);
  const CallPlan symmetric_broadcast = plan_call(shape(Collective::kBroadcast, (size_t(32) << 20) + 4), kAreas, mapped());
  EXPECT_EQ(symmetric_broadcast.algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(symmetric_broadcast.mode, BufferMode::kZeroCopy);
  EXPECT_EQ(plan_call(shape(Collective::kBroadcast, size_t(512) << 20, 4), kAreas, {}).algorithm, Algorithm::kPipelined);
  // Reduce-scatter takes them beyond 64 MiB on 2 ranks and beyond 32 MiB on 3 and 4; reduce and all-reduce never.
  EXPECT_EQ(plan_call(shape(Collective::kReduceScatter, size_t(64) << 20), kAreas, {}).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kReduceScatter, (size_t(64) << 20) + 16), kAreas, in_place).algorithm,
            Algorithm::kCopyEngine);
  for (int world : {3, 4}) {
    const size_t cut = (size_t(32) << 20) / 12 * 12;  // whole blocks of float32 on 3 and 4 ranks
    EXPECT_EQ(plan_call(shape(Collective::kReduceScatter, cut, world), kAreas, {}).algorithm, Algorithm::kPipelined);
    EXPECT_EQ(plan_call(shape(Collective::kReduceScatter, (size_t(32) << 20) + 48, world), kAreas, in_place).algorithm,
              Algorithm::kCopyEngine);
  }
  EXPECT_EQ(plan_call(shape(Collective::kReduceScatter, size_t(512) << 20, 4), kAreas, mapped()).algorithm,
            Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kReduceScatter, size_t(512) << 20, 5), kAreas, {}).algorithm,
            Algorithm::kPipelined);  // the cost model's rows beyond 4 ranks
  EXPECT_EQ(plan_call(shape(Collective::kReduce, size_t(512) << 20), kAreas, mapped()).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kReduce, size_t(512) << 20, 4), kAreas, {}).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kAllReduce, size_t(512) << 20), kAreas, {}).algorithm, Algorithm::kTwoShot);
  // Forced, the pairs serve any size out of place, and an in-place call still runs the FIFO pushes.
  const std::string forced = "alltoall=copyengine";
  const CallShape small = shape(Collective::kAllToAll, size_t(1) << 20, 2, DataType::kFloat32, &forced);
  EXPECT_EQ(plan_call(small, kAreas, {}).algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(plan_call(small, kAreas, in_place).algorithm, Algorithm::kPipelined);
}

// A send/recv pair of at most 256 KiB goes in LL128 lines where the GPUs carry them whole and the communicator has
// their area; beyond, and without either, the FIFO pushes. Forced onto lines, a pair larger than a slot stays on
// the FIFOs.
TEST(Planner, SmallSendRecvPairsGoInLines) {
  AreaCapacities areas = kAreas;
  areas.send_recv_lines_payload = size_t(256) << 10;
  const BufferFacts area = mapped();
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, 0), areas, area).algorithm, Algorithm::kLL128);
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, size_t(256) << 10), areas, area).algorithm, Algorithm::kLL128);
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, (size_t(256) << 10) + 1), areas, area).algorithm, Algorithm::kPipelined);
  CallShape no_lines = shape(Collective::kSendRecv, 8 << 10);
  no_lines.ll128 = false;  // PCIe peers, or BRAID_LL128=off
  EXPECT_EQ(plan_call(no_lines, areas, area).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, 8 << 10), kAreas, area).algorithm, Algorithm::kPipelined);  // no area
  const std::string lines = "sendrecv=ll128", fifo = "sendrecv=pipelined";
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, size_t(1) << 20, 2, DataType::kUint8, &lines), areas, area).algorithm,
            Algorithm::kPipelined);
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, 8 << 10, 2, DataType::kUint8, &fifo), areas, area).algorithm,
            Algorithm::kPipelined);
}

TEST(Planner, AllToAllvAndSendRecvAlwaysRunTheirFifoPipelineAtOneWidth) {
  for (Collective collective : {Collective::kAllToAllv, Collective::kSendRecv}) {
    const CallPlan plan = plan_call(shape(collective, 0), kAreas);
    EXPECT_EQ(plan.algorithm, Algorithm::kPipelined);
    EXPECT_EQ(plan.mode, BufferMode::kStagedCopy);
    EXPECT_EQ(plan.chunk, SIZE_MAX);
    // The width never depends on the sizes: ranks moving different amounts must launch alike.
    EXPECT_EQ(plan_call(shape(collective, size_t(512) << 20), kAreas).blocks, plan.blocks);
  }
  EXPECT_EQ(plan_call(shape(Collective::kSendRecv, 0), kAreas).blocks, 64);
}

}  // namespace
}  // namespace braid::collectives

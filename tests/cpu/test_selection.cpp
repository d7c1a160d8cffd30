// The selection table and BRAID_ALGO overrides (no GPU needed).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "braid/types.hpp"
#include "kernels/kernel_pairs.hpp"
#include "collectives/selection.hpp"
#include "core/error.hpp"

namespace braid {
namespace {

// One row per expectation: collective, bytes, world, datatype, BRAID_ALGO text, the algorithm the table picks.
struct Expected {
  Collective collective;
  size_t bytes;
  int world;
  DataType type;
  const char* override_text;
  Algorithm algorithm;
};

TEST(Selection, EveryCollectiveByItsSizeAndWorld) {
  const Expected expected[] = {
      {Collective::kAllReduce, 8 << 10, 4, DataType::kBFloat16, "", Algorithm::kLL},
      {Collective::kAllReduce, 128 << 20, 4, DataType::kFloat32, "", Algorithm::kTwoShot},
      {Collective::kAllGather, 64 << 20, 4, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kAllGather, 128 << 20, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kReduceScatter, 8 << 10, 4, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kReduceScatter, 1 << 20, 4, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kReduceScatter, 512 << 10, 2, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kReduceScatter, 1 << 20, 2, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kAllGather, 512 << 10, 4, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kAllGather, 1 << 20, 2, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kAllGather, 2 << 20, 2, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kAllGather, 4 << 20, 2, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kReduceScatter, 2 << 20, 2, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kReduceScatter, 64 << 20, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kReduceScatter, 8 << 10, 4, DataType::kFloat32, "reducescatter=pipelined", Algorithm::kPipelined},
      {Collective::kBroadcast, 8 << 10, 4, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kBroadcast, 256 << 10, 4, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kBroadcast, 512 << 10, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kBroadcast, 512 << 10, 2, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kBroadcast, 1 << 20, 2, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kBroadcast, 2 << 20, 2, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kBroadcast, size_t(1) << 20, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kBroadcast, size_t(2) << 20, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kBroadcast, size_t(512) << 20, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kBroadcast, size_t(16) << 20, 2, DataType::kFloat32, "", Algorithm::kStaged},
      {Collective::kBroadcast, size_t(64) << 20, 2, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kReduce, size_t(1) << 20, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kReduce, size_t(8) << 20, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kReduce, size_t(16) << 20, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kReduce, size_t(2) << 20, 4, DataType::kFloat32, "reduce=staged", Algorithm::kStaged},
      {Collective::kBroadcast, size_t(8) << 10, 2, DataType::kFloat32, "broadcast=split", Algorithm::kSplit},
      {Collective::kBroadcast, 8 << 10, 4, DataType::kFloat32, "broadcast=staged", Algorithm::kStaged},
      {Collective::kReduce, 128 << 10, 4, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kReduce, 256 << 10, 4, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kReduce, 256 << 10, 2, DataType::kFloat32, "", Algorithm::kLL},
      {Collective::kReduce, 512 << 10, 2, DataType::kFloat32, "", Algorithm::kPipelined},
      {Collective::kReduce, 512 << 10, 2, DataType::kFloat8E4M3, "", Algorithm::kLL},
      {Collective::kReduce, 1 << 20, 2, DataType::kFloat8E4M3, "", Algorithm::kStaged},
      {Collective::kReduce, 2 << 20, 2, DataType::kFloat8E4M3, "", Algorithm::kPipelined},
  };
  for (const Expected& row : expected) {
    SCOPED_TRACE(testing::Message() << collective_name(static_cast<unsigned int>(row.collective)) << ", " << row.bytes
                                    << " bytes, world " << row.world << ", override '" << row.override_text << "'");
    EXPECT_EQ(select_algorithm(row.collective, row.bytes, row.world, row.type, row.override_text).algorithm, row.algorithm);
  }
}

// NOTE [exchanged sizes]: the four collectives whose buffers peers can map exchange from 256 MiB of the call's
// size; no other collective does.
TEST(Selection, LargeEagerCallsExchangeTheirBuffersFrom256MiB) {
  constexpr size_t kLeast = size_t(256) << 20;
  for (const Collective collective :
       {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllReduce, Collective::kAllToAll}) {
    EXPECT_FALSE(exchanging_pays(collective, kLeast - 1)) << collective_name(static_cast<unsigned>(collective));
    EXPECT_TRUE(exchanging_pays(collective, kLeast)) << collective_name(static_cast<unsigned>(collective));
    EXPECT_TRUE(exchanging_pays(collective, size_t(1) << 32)) << collective_name(static_cast<unsigned>(collective));
  }
  for (const Collective collective : {Collective::kBroadcast, Collective::kReduce, Collective::kSendRecv}) {
    EXPECT_FALSE(exchanging_pays(collective, size_t(1) << 32)) << collective_name(static_cast<unsigned>(collective));
  }
}

TEST(Selection, SymmetricBuffersHaveRowsOfTheirOwn) {
  const auto pick = [](size_t bytes, Buffers buffers) {
    return select_algorithm(Collective::kAllReduce, bytes, 4, DataType::kBFloat16, "", buffers).algorithm;
  };
  // On 4 ranks LL128 serves every buffer through 512 KiB (LL through 64 KiB); beyond, the two shot: zero copy
  // on symmetric buffers, pipelined on others. On 8, the cost model's rows: LL through 64 KiB, then on any buffer
  // the one shot through 128 KiB and the two shot beyond.
  EXPECT_EQ(pick(64 << 10, Buffers::kSymmetric), Algorithm::kLL);
  EXPECT_EQ(pick(256 << 10, Buffers::kSymmetric), Algorithm::kLL128);
  EXPECT_EQ(pick(512 << 10, Buffers::kSymmetric), Algorithm::kLL128);
  EXPECT_EQ(pick((512 << 10) + 2, Buffers::kSymmetric), Algorithm::kTwoShot);
  EXPECT_EQ(pick(512 << 10, Buffers::kAny), Algorithm::kLL128);
  EXPECT_EQ(pick(1 << 20, Buffers::kAny), Algorithm::kTwoShot);
  EXPECT_EQ(pick(1 << 20, Buffers::kSymmetric), Algorithm::kTwoShot);
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, 64 << 10, 8, DataType::kBFloat16, "").algorithm, Algorithm::kLL);
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, (64 << 10) + 2, 8, DataType::kBFloat16, "").algorithm,
            Algorithm::kOneShot);
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, (128 << 10) + 2, 8, DataType::kBFloat16, "").algorithm,
            Algorithm::kTwoShot);
  EXPECT_EQ(pick(size_t(64) << 20, Buffers::kSymmetric), Algorithm::kTwoShot);
  // On 2 ranks LL128 serves every buffer through 1 MiB, and the zero-copy two shot symmetric buffers beyond.
  const auto pick2 = [](size_t bytes, Buffers buffers) {
    return select_algorithm(Collective::kAllReduce, bytes, 2, DataType::kBFloat16, "", buffers).algorithm;
  };
  EXPECT_EQ(pick2(1 << 20, Buffers::kSymmetric), Algorithm::kLL128);
  EXPECT_EQ(pick2((1 << 20) + 2, Buffers::kSymmetric), Algorithm::kTwoShot);
  // Beyond 64 MiB the copy engines where their gate opens (the peer maps the output, out of place).
  const auto engines2 = [](size_t bytes) {
    return select_algorithm(Collective::kAllReduce, bytes, 2, DataType::kBFloat16, "", Buffers::kSymmetric,
                            Gates{.copy_engines = true})
        .algorithm;
  };
  EXPECT_EQ(engines2(size_t(64) << 20), Algorithm::kTwoShot);
  EXPECT_EQ(engines2((size_t(64) << 20) + 2), Algorithm::kCopyEngine);
  EXPECT_EQ(pick2(size_t(512) << 20, Buffers::kSymmetric), Algorithm::kTwoShot);  // gate closed
  // Rows without a buffers column serve both.
  EXPECT_EQ(select_algorithm(Collective::kAllGather, 1 << 20, 4, DataType::kFloat32, "", Buffers::kSymmetric).algorithm,
            Algorithm::kStaged);
  // Reduce-scatter and all-gather go zero copy ("pipelined" on buffers peers map) beyond 4 MiB, where any other
  // buffer still stages (reduce-scatter through 16 MiB, all-gather through 64 MiB).
  for (Collective collective : {Collective::kReduceScatter, Collective::kAllGather}) {
    const auto choose = [&](size_t bytes, Buffers buffers) {
      return select_algorithm(collective, bytes, 4, DataType::kFloat32, "", buffers).algorithm;
    };
    EXPECT_EQ(choose(size_t(4) << 20, Buffers::kSymmetric), Algorithm::kStaged);
    EXPECT_EQ(choose((size_t(4) << 20) + 64, Buffers::kSymmetric), Algorithm::kPipelined);
    EXPECT_EQ(choose(size_t(8) << 20, Buffers::kAny), Algorithm::kStaged);
  }
  // Staged launches: one block through 32 KiB, then 16 KB a block up to the cap.
  const auto staged_blocks = [](size_t bytes) {
    return select_algorithm(Collective::kBroadcast, bytes, 4, DataType::kFloat32, "broadcast=staged").blocks;
  };
  EXPECT_EQ(staged_blocks(32 << 10), 1);
  EXPECT_EQ(staged_blocks(64 << 10), 4);
  EXPECT_EQ(staged_blocks(size_t(8) << 20), kMaxBlocks);
  // Zero-copy launches spread a size over more blocks than the pipelined ones; so does the staged one shot,
  // whose loads also come straight from peers (its staging).
  EXPECT_GT(select_algorithm(Collective::kAllReduce, 2 << 20, 4, DataType::kFloat32, "", Buffers::kSymmetric).blocks,
            select_algorithm(Collective::kAllReduce, 2 << 20, 4, DataType::kFloat32, "", Buffers::kAny).blocks);
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, 1 << 20, 2, DataType::kFloat32, "allreduce=oneshot").blocks,
            kMaxBlocks);
  // BRAID_ALGO still wins.
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, 1024, 4, DataType::kFloat32, "allreduce=twoshot", Buffers::kSymmetric)
                .algorithm,
            Algorithm::kTwoShot);
}

// 5 to 8 ranks, which no sweep measured, take the cost model's rows (bench/cost_model.py); no row measured on 2 or
// 4 ranks serves them, and send/recv keeps its measured rows.
TEST(Selection, WorldsNeverSweptTakeTheCostModelsRows) {
  const auto pick = [](Collective collective, size_t bytes, int world, Buffers buffers) {
    return select_algorithm(collective, bytes, world, DataType::kBFloat16, "", buffers, Gates{false, true}).algorithm;
  };
  for (int world = 5; world <= 8; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    // LL's single step wins longer where fewer peers share the links (each step costs a switch hop)
    const size_t ll_limit = world <= 6 ? size_t(2) << 20 : size_t(1) << 20;
    EXPECT_EQ(pick(Collective::kAllReduce, size_t(256) << 20, world, Buffers::kAny), Algorithm::kTwoShot);
    EXPECT_EQ(pick(Collective::kReduceScatter, ll_limit, world, Buffers::kAny), Algorithm::kLL);
    EXPECT_EQ(pick(Collective::kReduceScatter, ll_limit + 2, world, Buffers::kAny), Algorithm::kStaged);
    const size_t staged_limit = world == 5 ? size_t(16) << 20 : size_t(32) << 20;
    EXPECT_EQ(pick(Collective::kReduceScatter, staged_limit, world, Buffers::kAny), Algorithm::kStaged);
    EXPECT_EQ(pick(Collective::kReduceScatter, staged_limit + 2, world, Buffers::kAny), Algorithm::kPipelined);
    EXPECT_EQ(pick(Collective::kReduceScatter, ll_limit + 2, world, Buffers::kSymmetric), Algorithm::kPipelined);
    EXPECT_EQ(pick(Collective::kAllGather, size_t(32) << 20, world, Buffers::kSymmetric), Algorithm::kPipelined);
    EXPECT_EQ(pick(Collective::kAllGather, (size_t(32) << 20) + 8, world, Buffers::kSymmetric), Algorithm::kCopyEngine);
    EXPECT_EQ(pick(Collective::kAllGather, size_t(64) << 20, world, Buffers::kAny), Algorithm::kPipelined);
    EXPECT_EQ(pick(Collective::kAllToAll, size_t(64) << 20, world, Buffers::kAny), Algorithm::kPipelined);
    EXPECT_EQ(pick(Collective::kAllToAll, size_t(64) << 20, world, Buffers::kSymmetric), Algorithm::kCopyEngine);
    EXPECT_EQ(pick(Collective::kSendRecv, size_t(32) << 20, world, Buffers::kAny), Algorithm::kPipelined);
  }
  // Multicast keeps serving above LL where its gate opens.
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, size_t(1) << 20, 8, DataType::kBFloat16, "", Buffers::kAny,
                             Gates{true, true}).algorithm,
            Algorithm::kMulticast);
  // Past 8 ranks (ranks sharing GPUs) the rows for every world serve again.
  EXPECT_EQ(pick(Collective::kAllToAll, size_t(64) << 20, 9, Buffers::kSymmetric), Algorithm::kCopyEngine);
  EXPECT_EQ(pick(Collective::kAllReduce, 512 << 10, 9, Buffers::kAny), Algorithm::kLL);
}

TEST(Selection, AllToAllUsesCopyEnginesOnlyOnLargeSymmetricBuffers) {
  // Buffers peers map, none of them this process's cudaMalloc memory on another GPU: the copy engines' gate opens.
  const auto pick = [](Collective collective, size_t bytes, Buffers buffers, const std::string& text = "") {
    return select_algorithm(collective, bytes, 4, DataType::kFloat32, text, buffers,
                            Gates{.copy_engines = buffers == Buffers::kSymmetric});
  };
  EXPECT_EQ(pick(Collective::kAllToAll, size_t(512) << 20, Buffers::kAny).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kAllToAll, size_t(512) << 20, Buffers::kSymmetric).algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(pick(Collective::kAllToAll, 8 << 10, Buffers::kSymmetric).algorithm, Algorithm::kLL);
  EXPECT_EQ(pick(Collective::kAllToAll, 8 << 10, Buffers::kAny).algorithm, Algorithm::kLL);
  EXPECT_EQ(pick(Collective::kAllToAll, 2 << 20, Buffers::kSymmetric).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kAllToAll, size_t(64) << 20, Buffers::kSymmetric).algorithm, Algorithm::kCopyEngine);
  EXPECT_EQ(pick(Collective::kAllToAll, 8 << 10, Buffers::kSymmetric, "alltoall=copyengine").algorithm,
            Algorithm::kCopyEngine);
  EXPECT_EQ(pick(Collective::kAllToAllv, 8 << 10, Buffers::kAny).algorithm, Algorithm::kPipelined);
  // Ranks of an all-to-all-v move different amounts but must launch alike: the width does not follow the size.
  EXPECT_EQ(pick(Collective::kAllToAllv, 8 << 10, Buffers::kAny).blocks,
            pick(Collective::kAllToAllv, size_t(1) << 30, Buffers::kAny).blocks);
}

TEST(Selection, AllReduceTakesTheOneShotFurtherOnTwoRanks) {
  const auto pick = [](size_t bytes, int world, Buffers buffers = Buffers::kAny) {
    return select_algorithm(Collective::kAllReduce, bytes, world, DataType::kBFloat16, "", buffers).algorithm;
  };
  // On 2 ranks LL through 128 KiB, LL128 through 1 MiB; then a one shot, which moves what a two shot moves with
  // one barrier, wins through 16 MiB.
  EXPECT_EQ(pick(128 << 10, 2), Algorithm::kLL);
  EXPECT_EQ(pick((128 << 10) + 2, 2), Algorithm::kLL128);
  EXPECT_EQ(pick(1 << 20, 2, Buffers::kSymmetric), Algorithm::kLL128);
  EXPECT_EQ(pick((1 << 20) + 2, 2), Algorithm::kOneShot);
  EXPECT_EQ(pick(2 << 20, 2), Algorithm::kOneShot);
  EXPECT_EQ(pick(size_t(16) << 20, 2), Algorithm::kOneShot);
  EXPECT_EQ(pick((size_t(16) << 20) + 2, 2), Algorithm::kTwoShot);
  // Symmetric buffers keep the zero-copy two shot; more ranks take the two shot beyond LL128 (4) or LL (8).
  EXPECT_EQ(pick(2 << 20, 2, Buffers::kSymmetric), Algorithm::kTwoShot);
  EXPECT_EQ(pick(2 << 20, 4), Algorithm::kTwoShot);
  EXPECT_EQ(pick(1 << 20, 4), Algorithm::kTwoShot);
}

TEST(Selection, LargeCallsOnAnyBufferGoPipelinedSoonerOnTwoRanks) {
  const auto pick = [](Collective collective, size_t bytes, int world) {
    return select_algorithm(collective, bytes, world, DataType::kFloat32, "", Buffers::kAny).algorithm;
  };
  // Reduce-scatter: staged through 4 MiB on 2 ranks (16 MiB beyond); all-gather through 16 MiB (64 MiB beyond).
  EXPECT_EQ(pick(Collective::kReduceScatter, size_t(4) << 20, 2), Algorithm::kStaged);
  EXPECT_EQ(pick(Collective::kReduceScatter, (size_t(4) << 20) + 8, 2), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kReduceScatter, size_t(16) << 20, 4), Algorithm::kStaged);
  EXPECT_EQ(pick(Collective::kAllGather, size_t(16) << 20, 2), Algorithm::kStaged);
  EXPECT_EQ(pick(Collective::kAllGather, size_t(32) << 20, 2), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kAllGather, size_t(32) << 20, 4), Algorithm::kStaged);
  // Reduce: the chain to the root beyond LL's sizes (256 KiB on 2 ranks, 128 KiB on more).
  EXPECT_EQ(pick(Collective::kReduce, size_t(256) << 10, 2), Algorithm::kLL);
  EXPECT_EQ(pick(Collective::kReduce, (size_t(256) << 10) + 2, 2), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kReduce, size_t(512) << 20, 2), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kReduce, size_t(128) << 10, 4), Algorithm::kLL);
  EXPECT_EQ(pick(Collective::kReduce, (size_t(128) << 10) + 2, 4), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kReduce, size_t(64) << 20, 8), Algorithm::kPipelined);
}

TEST(Selection, CopyEnginesServeLargeCallsOnBuffersPeersMap) {
  const auto pick = [](Collective collective, size_t bytes, int world, Buffers buffers) {
    return select_algorithm(collective, bytes, world, DataType::kFloat32, "", buffers,
                            Gates{.copy_engines = buffers == Buffers::kSymmetric})
        .algorithm;
  };
  // All-gather: zero-copy stores through 64 MiB, copy engines beyond, on any world; other buffers never.
  EXPECT_EQ(pick(Collective::kAllGather, size_t(64) << 20, 2, Buffers::kSymmetric), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kAllGather, (size_t(64) << 20) + 64, 2, Buffers::kSymmetric), Algorithm::kCopyEngine);
  EXPECT_EQ(pick(Collective::kAllGather, size_t(512) << 20, 4, Buffers::kSymmetric), Algorithm::kCopyEngine);
  EXPECT_EQ(pick(Collective::kAllGather, size_t(512) << 20, 2, Buffers::kAny), Algorithm::kPipelined);
  // Broadcast: copy engines beyond 32 MiB on 2 ranks only (a root would push world-1 copies in turn).
  EXPECT_EQ(pick(Collective::kBroadcast, size_t(32) << 20, 2, Buffers::kSymmetric), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kBroadcast, (size_t(32) << 20) + 4, 2, Buffers::kSymmetric), Algorithm::kCopyEngine);
  EXPECT_EQ(pick(Collective::kBroadcast, (size_t(32) << 20) + 4, 2, Buffers::kAny), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kBroadcast, size_t(512) << 20, 4, Buffers::kSymmetric), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kBroadcast, size_t(512) << 20, 2, Buffers::kAny), Algorithm::kPipelined);
  // Reduce-scatter: copy engines on 2 ranks, on inputs peers map beyond 128 MiB (zero-copy loads up to there), on
  // the others beyond 64 MiB (FIFO pushes up to there); on 3 and 4 ranks beyond 32 MiB on inputs no peer maps
  // (all-to-all's cut-off for the same pairs), never on inputs peers map. Reduce: never (on 2 ranks
  // the other rank's pushes to the root, whatever the size). All-reduce: beyond 64 MiB on 2 ranks (its own test
  // above); forced where its gate is closed, the table's choice (it has no FIFO pushes to fall back to).
  const auto pick_reduce_scatter = [](size_t bytes, int world, Buffers buffers) {
    return select_algorithm(Collective::kReduceScatter, bytes, world, DataType::kBFloat16, "", buffers,
                            Gates{.copy_engines = true})
        .algorithm;
  };
  EXPECT_EQ(pick_reduce_scatter(size_t(128) << 20, 2, Buffers::kSymmetric), Algorithm::kPipelined);
  EXPECT_EQ(pick_reduce_scatter((size_t(128) << 20) + 64, 2, Buffers::kSymmetric), Algorithm::kCopyEngine);
  EXPECT_EQ(pick_reduce_scatter(size_t(64) << 20, 2, Buffers::kAny), Algorithm::kPipelined);
  EXPECT_EQ(pick_reduce_scatter((size_t(64) << 20) + 64, 2, Buffers::kAny), Algorithm::kCopyEngine);
  EXPECT_EQ(pick_reduce_scatter(size_t(512) << 20, 4, Buffers::kSymmetric), Algorithm::kPipelined);
  EXPECT_EQ(pick_reduce_scatter(size_t(32) << 20, 4, Buffers::kAny), Algorithm::kPipelined);
  EXPECT_EQ(pick_reduce_scatter((size_t(32) << 20) + 64, 4, Buffers::kAny), Algorithm::kCopyEngine);
  EXPECT_EQ(pick_reduce_scatter(size_t(512) << 20, 3, Buffers::kAny), Algorithm::kCopyEngine);
  EXPECT_EQ(select_algorithm(Collective::kReduceScatter, size_t(512) << 20, 2, DataType::kBFloat16, "", Buffers::kAny)
                .algorithm,
            Algorithm::kPipelined);  // the gate closed: the next row
  EXPECT_EQ(pick(Collective::kReduce, size_t(512) << 20, 2, Buffers::kSymmetric), Algorithm::kPipelined);
  EXPECT_EQ(pick(Collective::kReduce, size_t(512) << 20, 4, Buffers::kSymmetric), Algorithm::kPipelined);
  const std::pair<Collective, const char*> forced[] = {{Collective::kAllGather, "allgather=copyengine"},
                                                       {Collective::kBroadcast, "broadcast=copyengine"},
                                                       {Collective::kAllToAll, "alltoall=copyengine"}};
  for (const auto& [collective, text] : forced) {
    EXPECT_EQ(select_algorithm(collective, 1 << 20, 2, DataType::kFloat32, text, Buffers::kSymmetric,
                               Gates{.copy_engines = true})
                  .algorithm,
              Algorithm::kCopyEngine)
        << text;
    // Where the copy engines cannot reach the buffers, the forced call runs pipelined (FIFO pushes serve any
    // buffer), never the table's LL or staged choice for the size.
    EXPECT_EQ(select_algorithm(collective, 1 << 20, 2, DataType::kFloat32, text, Buffers::kSymmetric).algorithm,
              Algorithm::kPipelined)
        << text;
    EXPECT_EQ(select_algorithm(collective, 1 << 20, 2, DataType::kFloat32, text).algorithm, Algorithm::kPipelined) << text;
  }
  // A closed gate moves the table on to its next row: large symmetric buffers of same-process peers.
  EXPECT_EQ(select_algorithm(Collective::kAllGather, size_t(512) << 20, 2, DataType::kFloat32, "", Buffers::kSymmetric)
                .algorithm,
            Algorithm::kPipelined);
  EXPECT_EQ(select_algorithm(Collective::kAllToAll, size_t(512) << 20, 2, DataType::kFloat32, "", Buffers::kSymmetric)
                .algorithm,
            Algorithm::kPipelined);
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, 1 << 20, 2, DataType::kFloat32, "allreduce=copyengine",
                             Buffers::kSymmetric, Gates{.copy_engines = true})
                .algorithm,
            Algorithm::kCopyEngine);
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, 1 << 20, 2, DataType::kFloat32, "allreduce=copyengine",
                             Buffers::kSymmetric)
                .algorithm,
            select_algorithm(Collective::kAllReduce, 1 << 20, 2, DataType::kFloat32, "", Buffers::kSymmetric).algorithm);
}

// On buffers no peer maps the copy engines' gate opens for an all-to-all out of place (send/recv's pairs into the
// peers' pipeline areas): beyond 64 MiB on 2 ranks, beyond 32 MiB on 3-4 ranks, never on more (not measured).
TEST(Selection, AllToAllTakesCopyEnginePairsOnBuffersNoPeerMaps) {
  const auto pick = [](size_t bytes, int world) {
    return select_algorithm(Collective::kAllToAll, bytes, world, DataType::kBFloat16, "", Buffers::kAny,
                            Gates{.copy_engines = true})
        .algorithm;
  };
  EXPECT_EQ(pick(size_t(64) << 20, 2), Algorithm::kPipelined);
  EXPECT_EQ(pick((size_t(64) << 20) + 2, 2), Algorithm::kCopyEngine);
  for (int world : {3, 4}) {
    EXPECT_EQ(pick(size_t(32) << 20, world), Algorithm::kPipelined) << world;
    EXPECT_EQ(pick((size_t(32) << 20) + 2, world), Algorithm::kCopyEngine) << world;
    EXPECT_EQ(pick(size_t(512) << 20, world), Algorithm::kCopyEngine) << world;
  }
  EXPECT_EQ(pick(size_t(512) << 20, 8), Algorithm::kPipelined);
  // An all-to-all in place keeps the gate closed (its pairs would read blocks its receives overwrite).
  EXPECT_EQ(select_algorithm(Collective::kAllToAll, size_t(512) << 20, 4, DataType::kBFloat16, "", Buffers::kAny,
                             Gates{.copy_engines = false})
                .algorithm,
            Algorithm::kPipelined);
}

TEST(Selection, AllToAllTakesLLFurtherOnTwoRanks) {
  const auto pick = [](size_t bytes, int world, Buffers buffers) {
    return select_algorithm(Collective::kAllToAll, bytes, world, DataType::kFloat32, "", buffers).algorithm;
  };
  // 2 MiB on 2 ranks is a 1 MiB block: one LL slot holds it, and LL beats FIFO pushes there.
  EXPECT_EQ(pick(size_t(1) << 20, 2, Buffers::kAny), Algorithm::kLL);
  EXPECT_EQ(pick(size_t(2) << 20, 2, Buffers::kAny), Algorithm::kLL);
  EXPECT_EQ(pick(size_t(2) << 20, 2, Buffers::kSymmetric), Algorithm::kLL);
  EXPECT_EQ(pick((size_t(2) << 20) + 4, 2, Buffers::kAny), Algorithm::kPipelined);
  // Not measured on more ranks: the 512 KiB cut-off holds there.
  EXPECT_EQ(pick(size_t(1) << 20, 4, Buffers::kAny), Algorithm::kPipelined);
  EXPECT_EQ(pick(size_t(512) << 10, 4, Buffers::kAny), Algorithm::kLL);
}

// Ranks decide LL from the call alone: LL polls compare no plans, so a rank whose own buffers turned an LL call
// into a barrier kernel would leave its peers polling until the timeout. runs_ll() (which lets an LL call skip
// every buffer lookup) answers for both kinds. Every collective, world 1 to 8, sizes around every power of two
// and every cut-off, with and without multicast, with overrides that name LL or another algorithm.
TEST(Selection, LLNeverDependsOnTheBuffers) {
  const Collective collectives[] = {Collective::kAllReduce, Collective::kReduce,   Collective::kReduceScatter,
                                    Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll};
  const char* overrides[] = {"", "allreduce=ll", "allreduce=ll128", "allreduce=twoshot", "reduce=ll", "reducescatter=pipelined",
                             "allgather=ll", "broadcast=copyengine", "alltoall=ll", "alltoall=copyengine"};
  std::vector<size_t> sizes;
  for (int shift = 0; shift <= 30; ++shift) {
    for (size_t size : {size_t(1) << shift, (size_t(3) << shift) / 2}) {
      for (size_t near : {size - 1, size, size + 1}) sizes.push_back(near);
    }
  }
  size_t checked = 0, ll = 0;
  for (Collective collective : collectives) {
    for (const char* text : overrides) {
      for (int world = 1; world <= 8; ++world) {
        for (bool multicast : {false, true}) {
          for (bool ll_fits : {true, false}) {
            for (size_t bytes : sizes) {
              // Buffers peers cannot map; buffers they map, copy engines closed (same-process peers) and open.
              const auto algorithm = [&](Buffers buffers, bool copy_engines) {
                const Gates gates{.multicast = multicast, .copy_engines = copy_engines, .ll_fits = ll_fits};
                return select_algorithm(collective, bytes, world, DataType::kBFloat16, text, buffers, gates).algorithm;
              };
              const auto lines = [](Algorithm a) { return a == Algorithm::kLL || a == Algorithm::kLL128; };
              const bool any = lines(algorithm(Buffers::kAny, false));
              for (bool copy_engines : {false, true}) {
                ASSERT_EQ(any, lines(algorithm(Buffers::kSymmetric, copy_engines)))
                    << collective_name(static_cast<unsigned int>(collective)) << ", " << bytes << " bytes, world "
                    << world << ", override '" << text << "', multicast " << multicast << ", copy engines "
                    << copy_engines << ", LL fits " << ll_fits;
              }
              ASSERT_EQ(any, runs_ll(collective, bytes, world, DataType::kBFloat16, text,
                                     Gates{.multicast = multicast, .ll_fits = ll_fits}));
              if (!ll_fits) ASSERT_NE(algorithm(Buffers::kAny, false), Algorithm::kLL);  // the gate is LL's alone
              ++checked;
              ll += any;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(ll, 0u);
  EXPECT_LT(ll, checked);
}

TEST(Selection, BlocksGrowWithSizeWithinTheChannelLimit) {
  int small = select_algorithm(Collective::kAllReduce, 1024, 4, DataType::kFloat32, "").blocks;
  int large = select_algorithm(Collective::kAllReduce, size_t(512) << 20, 4, DataType::kFloat32, "").blocks;
  EXPECT_GE(small, 1);
  EXPECT_GT(large, small);
  EXPECT_LE(large, 64);
}

// LL blocks: a line (8 payload bytes) a thread of each peer's payload, 4 KB a block, where every peer gets the
// whole buffer; 8 KB of the output or input (4 KB to each peer on 2 ranks) for the others.
TEST(Selection, LLBlocksCarryALineAThread) {
  auto blocks = [](Collective collective, size_t bytes) {
    const Choice choice = select_algorithm(collective, bytes, 2, DataType::kBFloat16, "");
    EXPECT_EQ(choice.algorithm, Algorithm::kLL) << collective_name(static_cast<unsigned int>(collective));
    return choice.blocks;
  };
  EXPECT_EQ(blocks(Collective::kAllReduce, 8 << 10), 2);
  EXPECT_EQ(blocks(Collective::kAllReduce, 64 << 10), 16);
  EXPECT_EQ(blocks(Collective::kReduce, 8 << 10), 2);
  EXPECT_EQ(blocks(Collective::kBroadcast, 8 << 10), 2);
  EXPECT_EQ(blocks(Collective::kAllReduce, 1 << 10), 1);
  EXPECT_EQ(blocks(Collective::kAllGather, 8 << 10), 1);
  EXPECT_EQ(blocks(Collective::kAllToAll, 8 << 10), 1);
  EXPECT_EQ(blocks(Collective::kReduceScatter, 8 << 10), 1);
}

TEST(Selection, OverrideChangesOnlyTheNamedCollective) {
  const std::string text = "allreduce=twoshot,allgather=pipelined";
  EXPECT_EQ(select_algorithm(Collective::kAllReduce, 1024, 4, DataType::kFloat32, text).algorithm, Algorithm::kTwoShot);
  EXPECT_EQ(select_algorithm(Collective::kReduce, 1024, 4, DataType::kFloat32, text).algorithm, Algorithm::kLL);  // the table's choice
}

void expect_rejected(const std::string& text, const std::string& fragment) {
  try {
    select_algorithm(Collective::kAllReduce, 1024, 2, DataType::kFloat32, text);
    ADD_FAILURE() << "accepted " << text;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("BRAID_ALGO"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

TEST(Selection, BadOverridesAreRefusedNamingTheVariable) {
  expect_rejected("allreduce", "is not collective=algorithm");
  expect_rejected("gather=staged", "unknown collective 'gather'");
  expect_rejected("alltoall=oneshot", "alltoall cannot run as oneshot");
  expect_rejected("alltoallv=copyengine", "alltoallv cannot run as copyengine");
  expect_rejected("allreduce=ring", "unknown algorithm 'ring'");
  expect_rejected("allreduce=staged", "allreduce cannot run as staged");
  expect_rejected("broadcast=twoshot", "broadcast cannot run as twoshot");
  expect_rejected("allgather=oneshot", "allgather cannot run as oneshot");
  expect_rejected("reduce=oneshot", "reduce cannot run as oneshot");
}

// The two shot gathered by the root serves reduce only when forced (it rounds once where the chain rounds per step).
TEST(Selection, ReduceRunsAsTheTwoShotOnlyWhenForced) {
  const auto pick = [](int world, const char* overrides) {
    return select_algorithm(Collective::kReduce, size_t(64) << 20, world, DataType::kBFloat16, overrides).algorithm;
  };
  for (int world : {2, 4, 8}) {
    EXPECT_EQ(pick(world, "reduce=twoshot"), Algorithm::kTwoShot);
    EXPECT_EQ(pick(world, ""), Algorithm::kPipelined);
  }
}

TEST(Selection, DatatypeTable) {
  EXPECT_EQ(datatype_size(DataType::kBFloat16), 2u);
  EXPECT_EQ(datatype_size(DataType::kFloat64), 8u);
  EXPECT_EQ(datatype_size(static_cast<DataType>(99)), 0u);
  EXPECT_STREQ(datatype_name(DataType::kUint8), "uint8");
  EXPECT_TRUE(is_floating(DataType::kFloat16));
  EXPECT_FALSE(is_floating(DataType::kInt64));
  EXPECT_EQ(datatype_size(DataType::kFloat8E4M3), 1u);
  EXPECT_EQ(datatype_size(DataType::kFloat8E5M2), 1u);
  EXPECT_STREQ(datatype_name(DataType::kFloat8E4M3), "float8e4m3");
  EXPECT_TRUE(is_floating(DataType::kFloat8E5M2));
  EXPECT_STREQ(collective_name(static_cast<unsigned>(Collective::kReduceScatter)), "reduce_scatter");
  EXPECT_STREQ(collective_name(static_cast<unsigned>(Collective::kSendRecv)), "send_recv");
}

// The (datatype, op) table that host checks and kernel instantiation share: every op on every datatype (avg on
// integers too, as NCCL), nothing outside the enums.
TEST(Selection, ReductionTable) {
  static_assert(reduction_supported(DataType::kBFloat16, ReduceOp::kAvg));
  static_assert(reduction_supported(DataType::kInt32, ReduceOp::kAvg));
  static_assert(!reduction_supported(DataType::kInt32, static_cast<ReduceOp>(kReduceOpCount)));
  static_assert(!reduction_supported(static_cast<DataType>(kDataTypeCount), ReduceOp::kSum));
  int pairs = 0;
  for (int t = 0; t < kDataTypeCount; ++t) {
    for (int o = 0; o < kReduceOpCount; ++o) pairs += reduction_supported(static_cast<DataType>(t), static_cast<ReduceOp>(o));
  }
  EXPECT_EQ(pairs, kDataTypeCount * kReduceOpCount);
}

// A full build (BRAID_KERNEL_PAIRS=all, what CI builds) has a reduction kernel for every pair braid reduces; a
// developer build has a subset of them, and never a pair braid does not reduce.
TEST(Selection, KernelPairsOfThisBuild) {
  int built = 0;
  for (int t = 0; t < kDataTypeCount; ++t) {
    for (int o = 0; o < kReduceOpCount; ++o) {
      const auto type = static_cast<DataType>(t);
      const auto op = static_cast<ReduceOp>(o);
      if (kernels::kernel_pair_built(type, op)) EXPECT_TRUE(reduction_supported(type, op));
      built += kernels::kernel_pair_built(type, op);
    }
  }
  EXPECT_FALSE(kernels::kernel_pair_built(static_cast<DataType>(kDataTypeCount), ReduceOp::kSum));
  if (std::string(kernels::kKernelPairsOption) != "all") {
    GTEST_SKIP() << "a developer build (BRAID_KERNEL_PAIRS=" << kernels::kKernelPairsOption << "): " << built
                 << " pairs built";
  }
  EXPECT_EQ(built, kDataTypeCount * kReduceOpCount);
}

// The datatype is a key of the table: the fp8 types' reductions convert every element, which keeps the staged
// reduce-scatter ahead of the pipelined one up to 8 MiB on 2 ranks; other types and other rows ignore it.
// Where the GPUs cannot deliver a 128-byte line whole (PCIe peers), the LL128 rows do not apply: LL and the one
// shot serve those sizes, as before LL128.
TEST(Selection, LL128NeedsLinesThatLandWhole) {
  const auto pick = [](size_t bytes, bool ll128, const std::string& text = "") {
    Gates gates;
    gates.ll128 = ll128;
    return select_algorithm(Collective::kAllReduce, bytes, 2, DataType::kBFloat16, text, Buffers::kAny, gates).algorithm;
  };
  EXPECT_EQ(pick(size_t(512) << 10, true), Algorithm::kLL128);
  EXPECT_EQ(pick(size_t(512) << 10, false), Algorithm::kLL);
  EXPECT_EQ(pick(size_t(1) << 20, false), Algorithm::kOneShot);
  EXPECT_EQ(pick(size_t(1) << 20, false, "allreduce=ll128"), Algorithm::kOneShot);  // forced: the table's choice
  EXPECT_FALSE(runs_ll(Collective::kAllReduce, size_t(1) << 20, 2, DataType::kBFloat16, "", Gates{.ll128 = false}));
}

// LL128 on 2 ranks: the fp8 types (two 480-byte groups a warp a round) hand 1 MiB to the one shot.
TEST(Selection, Fp8AllReduceLeavesLL128SoonerOnTwoRanks) {
  const auto pick = [](DataType type, size_t bytes, Buffers buffers = Buffers::kAny) {
    return select_algorithm(Collective::kAllReduce, bytes, 2, type, "", buffers).algorithm;
  };
  for (DataType fp8 : {DataType::kFloat8E4M3, DataType::kFloat8E5M2}) {
    EXPECT_EQ(pick(fp8, size_t(128) << 10), Algorithm::kLL);
    EXPECT_EQ(pick(fp8, size_t(512) << 10), Algorithm::kLL128);
    EXPECT_EQ(pick(fp8, size_t(1) << 20), Algorithm::kOneShot);
    EXPECT_EQ(pick(fp8, size_t(1) << 20, Buffers::kSymmetric), Algorithm::kOneShot);
  }
  for (DataType type : {DataType::kBFloat16, DataType::kFloat16, DataType::kFloat32, DataType::kInt8}) {
    EXPECT_EQ(pick(type, size_t(1) << 20), Algorithm::kLL128);
  }
}

TEST(Selection, Fp8ReduceScatterStagesFurtherOnTwoRanks) {
  const auto pick = [](DataType type, size_t bytes, int world, Buffers buffers = Buffers::kAny) {
    return select_algorithm(Collective::kReduceScatter, bytes, world, type, "", buffers).algorithm;
  };
  for (DataType fp8 : {DataType::kFloat8E4M3, DataType::kFloat8E5M2}) {
    EXPECT_EQ(pick(fp8, size_t(8) << 20, 2), Algorithm::kStaged);
    EXPECT_EQ(pick(fp8, (size_t(8) << 20) + 8, 2), Algorithm::kPipelined);
    EXPECT_EQ(pick(fp8, size_t(4) << 20, 2, Buffers::kSymmetric), Algorithm::kPipelined);
    EXPECT_EQ(pick(fp8, size_t(8) << 20, 4), Algorithm::kStaged);
    EXPECT_EQ(pick(fp8, size_t(512) << 10, 2), Algorithm::kLL);
  }
  for (DataType type : {DataType::kBFloat16, DataType::kFloat16, DataType::kFloat32, DataType::kInt8}) {
    EXPECT_EQ(pick(type, size_t(8) << 20, 2), Algorithm::kPipelined);
    EXPECT_EQ(pick(type, size_t(4) << 20, 2), Algorithm::kStaged);
  }
  // On 2 ranks, buffers peers map go zero copy beyond 2 MiB, whatever the type.
  EXPECT_EQ(pick(DataType::kBFloat16, size_t(2) << 20, 2, Buffers::kSymmetric), Algorithm::kStaged);
  EXPECT_EQ(pick(DataType::kBFloat16, (size_t(2) << 20) + 8, 2, Buffers::kSymmetric), Algorithm::kPipelined);
  // Whether a call runs LL never depends on its type beyond its size.
  for (DataType type : {DataType::kFloat8E4M3, DataType::kBFloat16, DataType::kFloat32}) {
    EXPECT_TRUE(runs_ll(Collective::kReduceScatter, 512 << 10, 2, type, ""));
    EXPECT_FALSE(runs_ll(Collective::kReduceScatter, 1 << 20, 2, type, ""));
  }
}

}  // namespace
}  // namespace braid

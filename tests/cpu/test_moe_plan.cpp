// How MoE dispatch and combine cut their work (moe_plan.hpp): every token must fall in some round of some active
// block, slices must tile a row in whole vectors, and combine's pieces and blocks must stay within their limits.
// Every rank computes the same plan from the same counts, so a wrong plan is a hang or lost rows, not a slow call.
// No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "kernels/moe_plan.hpp"

namespace braid::kernels::moe {
namespace {

TEST(MoePlan, ScatterCoversEveryTokenWithSlicesThatTileTheRow) {
  for (size_t row_bytes : {size_t(16), size_t(2048), size_t(4096), size_t(7168), size_t(14336), size_t(28672),
                           size_t(14336 + 16), size_t(1) << 20}) {
    for (uint32_t blocks : {1u, 2u, 7u, 64u, 256u}) {
      for (uint32_t longest : {0u, 1u, 2u, 15u, 16u, 17u, 127u, 128u, 129u, 1000u, 4096u, 65536u}) {
        SCOPED_TRACE(testing::Message() << "row " << row_bytes << " blocks " << blocks << " longest " << longest);
        const ScatterPlan plan = plan_scatter(row_bytes, longest, blocks);
        ASSERT_GE(plan.slices, 1);
        EXPECT_EQ(plan.slices & (plan.slices - 1), 0) << "a power of two";
        EXPECT_EQ(plan.slices * plan.per_round, kMoeWarps);
        EXPECT_EQ(plan.slice_bytes % kRowVectorBytes, 0u);
        EXPECT_GE(plan.slice_bytes * plan.slices, row_bytes);
        // Token i of a list goes in round i / (blocks * per_round), block (i / per_round) % blocks.
        EXPECT_GE(uint64_t(plan.rounds) * blocks * plan.per_round, longest);
        EXPECT_LT(uint64_t(plan.rounds == 0 ? 0 : plan.rounds - 1) * blocks * plan.per_round, longest + (longest == 0));
        EXPECT_LE(plan.active_blocks, static_cast<int>(blocks));
        if (plan.own_apart) {  // the active blocks' own rows go to as many blocks past them, in one round
          EXPECT_LE(plan.rounds, 1);
          EXPECT_LE(2 * plan.active_blocks, static_cast<int>(blocks));
        }
        if (longest > 0) {
          EXPECT_GE(uint64_t(plan.active_blocks) * plan.per_round, std::min<uint64_t>(longest, uint64_t(blocks) * plan.per_round));
          EXPECT_LT(uint64_t(plan.active_blocks - 1) * plan.per_round, longest) << "an active block has a token";
        }
      }
    }
  }
}

TEST(MoePlan, DecodeBatchesSpreadOverBlocksAndLargeOnesKeepWideSlices) {
  // H = 7168 bf16 on 256 blocks: T = 128 takes 128 blocks (a token each, 16 slices); T = 4096 keeps slices of
  // at least kSliceBytes (4 of a 14 KiB row) and takes several rounds.
  // A decode batch leaves the other 128 blocks the own rows; T = 4096 needs every block to send.
  const ScatterPlan decode = plan_scatter(14336, 128, 256);
  EXPECT_EQ(decode.per_round, 1);
  EXPECT_EQ(decode.active_blocks, 128);
  EXPECT_EQ(decode.rounds, 1);
  EXPECT_TRUE(decode.own_apart);
  const ScatterPlan prefill = plan_scatter(14336, 4096, 256);
  EXPECT_EQ(prefill.slices, 4);
  EXPECT_GE(prefill.slice_bytes, kSliceBytes);
  EXPECT_EQ(prefill.rounds, 4);
  EXPECT_EQ(prefill.active_blocks, 256);
  EXPECT_FALSE(prefill.own_apart);
  EXPECT_FALSE(plan_scatter(14336, 128, 1).own_apart) << "one block has no other half";
}

TEST(MoePlan, CombinePiecesAndBlocksStayInTheirLimits) {
  constexpr int64_t kGroups = kMoeThreads / kCombineGroup;
  for (uint32_t blocks : {1u, 64u, 256u}) {
    for (int64_t received : {int64_t(0), int64_t(1), int64_t(127), int64_t(256), int64_t(1024), int64_t(2048),
                             int64_t(8192), int64_t(1) << 20}) {
      SCOPED_TRACE(testing::Message() << "blocks " << blocks << " received " << received);
      const CombinePlan plan = plan_combine(received, blocks);
      EXPECT_GE(plan.pieces, 1);
      EXPECT_LE(plan.pieces, kCombineSlices);
      EXPECT_EQ(plan.pieces & (plan.pieces - 1), 0);
      EXPECT_LE(plan.blocks, static_cast<int>(blocks));
      EXPECT_EQ(plan.blocks == 0, received == 0) << "blocks with work exactly when there is work";
      // Pieces stop doubling once the groups have about kCombinePiecesPerGroup each.
      if (plan.pieces > 1) EXPECT_LE(received * plan.pieces, kCombinePiecesPerGroup * kGroups * int64_t(blocks));
    }
  }
  // 2 ranks, T = 128 / 1024 / 4096 (about 2T received) on 256 blocks: 8 / 2 / 1 pieces.
  EXPECT_EQ(plan_combine(256, 256).pieces, 8);
  EXPECT_EQ(plan_combine(2048, 256).pieces, 2);
  EXPECT_EQ(plan_combine(8192, 256).pieces, 1);
}

}  // namespace
}  // namespace braid::kernels::moe

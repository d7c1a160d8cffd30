// How the pipelined all-to-all cuts a pair into FIFO pieces (pair_piece_payload): a piece must never be larger
// than the slot it is pushed into (it would overwrite the next slot, which a receiver may still be reading), must
// keep 16-byte alignment, and should give large pairs several rounds. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/all_to_all_launch.hpp"
#include "kernels/pipeline_launch.hpp"

namespace braid::kernels {
namespace {

uint64_t rounds_of(uint64_t bytes, uint32_t blocks, uint64_t payload) {
  const uint64_t per_round = uint64_t(blocks) * payload;
  return (bytes + per_round - 1) / per_round;
}

TEST(AllToAllPieces, PiecesFitTheirSlotKeepAlignmentAndCoverThePair) {
  std::vector<uint64_t> sizes = {0, 1, 15, 16, 17, 4095, 4096, 65535, 65536, 65537};
  for (uint64_t mib : {1, 2, 3, 7, 8, 16, 31, 32, 64, 128, 256, 512, 1024, 2048}) {
    sizes.push_back(mib << 20);
    sizes.push_back((mib << 20) + 4);
  }
  for (int world : {2, 3, 4, 8, 16}) {
    for (size_t area : {size_t(32) << 20, size_t(256) << 20, size_t(1) << 30}) {
      const size_t slot = pipeline_piece_bytes(area, world);
      ASSERT_GT(slot, kAllToAllHeaderBytes) << "area " << area << " world " << world;
      const uint64_t max_payload = slot - kAllToAllHeaderBytes;
      for (uint32_t blocks : {1u, 7u, 32u, 64u}) {
        for (uint64_t bytes : sizes) {
          const uint64_t payload = pair_piece_payload(bytes, blocks, max_payload);
          SCOPED_TRACE(testing::Message() << "world " << world << " area " << area << " blocks " << blocks << " bytes " << bytes);
          EXPECT_LE(payload, max_payload);
          EXPECT_GT(payload, 0u);
          EXPECT_EQ(payload % 16, 0u);
          EXPECT_GE(payload, std::min<uint64_t>(kMinPiecePayload, max_payload / 16 * 16));
          // No more rounds of `blocks` pieces than a smaller piece would need.
          const uint64_t rounds = rounds_of(bytes, blocks, payload);
          if (payload < max_payload && payload > kMinPiecePayload) EXPECT_LE(rounds, kMinPairRounds);
        }
      }
    }
  }
}

TEST(AllToAllPieces, LargePairsTakeAtLeastTheMinimumRounds) {
  const uint64_t max_payload = pipeline_piece_bytes(size_t(256) << 20, 2) - kAllToAllHeaderBytes;
  // 2 ranks, 64 blocks: a 16 MiB pair gets 64 KiB pieces and 4 rounds; 256 MiB the full slot and 16 rounds.
  EXPECT_EQ(pair_piece_payload(16 << 20, 64, max_payload), uint64_t(64) << 10);
  EXPECT_EQ(rounds_of(16 << 20, 64, pair_piece_payload(16 << 20, 64, max_payload)), kMinPairRounds);
  EXPECT_EQ(pair_piece_payload(uint64_t(256) << 20, 64, max_payload), max_payload);
  EXPECT_GE(rounds_of(uint64_t(256) << 20, 64, max_payload), 16u);
  // Small pairs stay in one round of minimum-size pieces.
  EXPECT_EQ(pair_piece_payload(1 << 20, 32, max_payload), kMinPiecePayload);
  EXPECT_EQ(rounds_of(1 << 20, 32, kMinPiecePayload), 1u);
}

}  // namespace
}  // namespace braid::kernels

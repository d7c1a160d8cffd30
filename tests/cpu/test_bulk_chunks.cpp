// How a copy-engine pair is cut into chunks (bulk_chunk_count, bulk_chunk): both sides compute the same list, the
// chunks cover the pair once in order, none is larger than a slot, every chunk but the last starts and ends on 256
// bytes (no element straddles two, vectors stay aligned), and there are as few as can be. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/pipeline_launch.hpp"
#include "kernels/send_recv_bulk_launch.hpp"

namespace braid::kernels {
namespace {

TEST(BulkChunks, ChunksCoverThePairFitASlotAndAreWholeSlots) {
  const BulkLayout layout = BulkLayout::of(pipeline_piece_bytes(size_t(256) << 20, 2), 2);
  const uint64_t slot = layout.slot_payload;
  ASSERT_EQ(slot, uint64_t(32) << 20);
  std::vector<uint64_t> sizes = {1, 7, 255, 256, 257, 4097};
  for (uint64_t mib : {1, 2, 3, 4, 5, 13, 31, 32, 33, 64, 100, 256, 512}) {
    sizes.push_back(mib << 20);
    sizes.push_back((mib << 20) + 3);
    sizes.push_back((mib << 20) - 256);
  }
  for (uint64_t bytes : sizes) {
    std::vector<BulkChunk> chunks;
    for (uint64_t c = 0; c < bulk_chunk_count(layout, bytes); ++c) chunks.push_back(bulk_chunk(layout, bytes, c));
    ASSERT_FALSE(chunks.empty()) << bytes;
    uint64_t offset = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      EXPECT_EQ(chunks[c].offset, offset) << bytes << " chunk " << c;
      EXPECT_GT(chunks[c].bytes, 0u) << bytes << " chunk " << c;
      EXPECT_LE(chunks[c].bytes, slot) << bytes << " chunk " << c;
      if (c + 1 < chunks.size()) EXPECT_EQ(chunks[c].bytes % 256, 0u) << bytes << " chunk " << c;
      offset += chunks[c].bytes;
    }
    EXPECT_EQ(offset, bytes);
    // Whole slots, as few chunks as can be.
    EXPECT_EQ(chunks.size(), (bytes + slot - 1) / slot) << bytes;
  }
  EXPECT_EQ(bulk_chunk_count(layout, 0), 0u);
}

}  // namespace
}  // namespace braid::kernels

// How a copy-engine pair is cut into chunks (bulk_chunk_count, bulk_chunk): both sides compute the same list, the
// chunks cover the pair once in order, none is larger than a slot, every chunk but the last starts and ends on 256
// bytes (no element straddles two, vectors stay aligned), and there are as few as can be. No GPU needed.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
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

// The contiguous window of the in-place all-reduce on 2 ranks (BulkLayout::window_of): two headers' rows, then two
// slots one after the other, all inside the area; rows of whole 256-byte multiples, kBulkRowsPerSlot a slot; a slot
// of at most 64 MiB; at least two chunks in a pair of the given bytes unless the slot is at its largest or the
// area holds no larger one; no layout where the area cannot hold the headers.
TEST(BulkChunks, TheContiguousWindowFitsTheAreaAndCutsAPairInTwoOrMore) {
  const std::vector<size_t> areas = {size_t(256) << 20, size_t(64) << 20, size_t(1) << 20, 66 * 256 + 100};
  for (const size_t area : areas) {
    const BulkLayout largest = BulkLayout::window_of(area, SIZE_MAX / 2);
    for (const uint64_t bytes : {uint64_t(1), uint64_t(257), uint64_t(1) << 20, (uint64_t(64) << 20) + 256,
                                 uint64_t(128) << 20, (uint64_t(512) << 20) + 3}) {
      SCOPED_TRACE("area " + std::to_string(area) + ", pair " + std::to_string(bytes));
      const BulkLayout layout = BulkLayout::window_of(area, bytes);
      ASSERT_GT(layout.slot_payload, 0u);
      EXPECT_EQ(layout.row_pitch, layout.row_bytes);
      EXPECT_EQ(layout.row_bytes % 256, 0u);
      EXPECT_EQ(layout.slot_payload, uint64_t(kBulkRowsPerSlot) * layout.row_bytes);
      EXPECT_LE(layout.slot_payload, uint64_t(64) << 20);
      char* const base = reinterpret_cast<char*>(uintptr_t(1) << 40);  // addresses only, never touched
      const char* headers_end = reinterpret_cast<const char*>(layout.header(base, 1, kBulkSlots - 1) + 1);
      EXPECT_LE(headers_end, layout.slot(base, 2, 0, 0));
      EXPECT_EQ(layout.slot(base, 2, 1, 1), layout.slot(base, 2, 1, 0) + layout.slot_payload);
      EXPECT_LE(static_cast<size_t>(layout.slot(base, 2, 0, 1) + layout.slot_payload - base), area);
      if (layout.slot_payload < largest.slot_payload && bytes > 256 * kBulkRowsPerSlot) {
        EXPECT_GE(bulk_chunk_count(layout, bytes), 2u);
      }
    }
  }
  EXPECT_EQ(BulkLayout::window_of(66 * 256 - 1, 1 << 20).slot_payload, 0u);
}

// Whether an area holds the window does not depend on the pair's bytes: the planner asks once with 1 byte
// (AreaCapacities::copy_engine_window) for every call.
TEST(BulkChunks, TheWindowsRoomDependsOnTheAreaAlone) {
  for (size_t area = 60 * 256; area <= 72 * 256; area += 37) {
    const bool room = BulkLayout::window_of(area, 1).slot_payload != 0;
    for (const uint64_t bytes : {uint64_t(2), uint64_t(4097), uint64_t(1) << 30, (uint64_t(1) << 40) + 1}) {
      EXPECT_EQ(BulkLayout::window_of(area, bytes).slot_payload != 0, room) << "area " << area << ", pair " << bytes;
    }
  }
  EXPECT_TRUE(BulkLayout::window_of(size_t(1) << 20, 1).slot_payload != 0);
}

}  // namespace
}  // namespace braid::kernels

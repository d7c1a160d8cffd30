// How kernels split a call's elements between blocks (kernels/block_slices.hpp): split_elements covers the
// elements once in whole vectors, and clip_slice, which the announcing kernels' staged rounds apply to a short last
// round, keeps every block inside its part of a full round (NOTE [announced staged rounds]: a block may write
// only what the same block of every peer has read) while still covering the round once. No GPU needed.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "kernels/block_slices.hpp"

namespace braid::kernels {
namespace {

// Elements [0, count) each claimed once by the slices, vectors whole ([begin, vector_end) a multiple of the
// vector, a non-empty one beginning on one), the scalar tail only past the last whole vector.
void expect_cover_once(const std::vector<Slice>& slices, size_t count, size_t per_vector, const char* what) {
  std::vector<int> claims(count, 0);
  for (const Slice& s : slices) {
    ASSERT_LE(s.begin, s.vector_end) << what;
    ASSERT_LE(s.vector_end, s.end) << what;
    ASSERT_LE(s.end, count) << what;
    if (s.vector_end > s.begin) EXPECT_EQ(s.begin % per_vector, 0u) << what;  // an empty part may sit anywhere
    EXPECT_EQ((s.vector_end - s.begin) % per_vector, 0u) << what;
    if (s.end > s.vector_end) EXPECT_EQ(s.vector_end, count / per_vector * per_vector) << what;
    for (size_t i = s.begin; i < s.end; ++i) ++claims[i];
  }
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(claims[i], 1) << what << ": element " << i;
}

TEST(BlockSlices, SplitCoversEveryElementOnceInWholeVectors) {
  for (const size_t per_vector : {1, 2, 4, 8, 16}) {
    for (const int blocks : {1, 2, 3, 7, 64}) {
      for (const size_t count : {0, 1, 5, 16, 17, 63, 64, 65, 1000, 4099}) {
        std::vector<Slice> slices;
        for (int b = 0; b < blocks; ++b) slices.push_back(split_elements(count, b, blocks, per_vector));
        expect_cover_once(slices, count, per_vector, "split");
      }
    }
  }
}

TEST(BlockSlices, AClippedRoundStaysInsideEachBlocksFullPartAndCoversTheRoundOnce) {
  for (const size_t per_vector : {1, 2, 4, 16}) {
    for (const int blocks : {1, 2, 3, 5, 64}) {
      for (const size_t chunk : {16, 100, 1024, 4096 + 3}) {
        for (size_t count = 0; count <= chunk; count += count < 40 ? 1 : 37) {
          std::vector<Slice> clipped;
          for (int b = 0; b < blocks; ++b) {
            const Slice full = split_elements(chunk, b, blocks, per_vector);
            const Slice part = clip_slice(full, count, b == blocks - 1, per_vector);
            if (part.end > part.begin) {  // inside the block's own part of a full round
              EXPECT_GE(part.begin, full.begin) << "block " << b << " count " << count << " chunk " << chunk;
              EXPECT_LE(part.end, full.end) << "block " << b << " count " << count << " chunk " << chunk;
            }
            clipped.push_back(part);
          }
          expect_cover_once(clipped, count, per_vector, "clipped round");
        }
      }
    }
  }
}

TEST(BlockSlices, AFullRoundIsLeftAsSplit) {
  const size_t chunk = 4096 + 3;
  for (int b = 0; b < 7; ++b) {
    const Slice full = split_elements(chunk, b, 7, 4), part = clip_slice(full, chunk, b == 6, 4);
    EXPECT_EQ(part.begin, full.begin);
    EXPECT_EQ(part.vector_end, full.vector_end);
    EXPECT_EQ(part.end, full.end);
  }
}

}  // namespace
}  // namespace braid::kernels

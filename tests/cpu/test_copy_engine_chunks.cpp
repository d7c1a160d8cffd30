// How the copy-engine schedules of 2 ranks cut a part into chunks (collectives/chunks.hpp): the chunks cover the
// part once in order, every chunk but the last ends on 256 bytes (no element straddles two), even chunks are even
// and at least two, tapered ones end with two small ones and stay within the bound a slot relies on. No GPU needed.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/chunks.hpp"

namespace braid::collectives {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

std::vector<size_t> sizes() {
  std::vector<size_t> all = {1, 7, 255, 256, 257, 4097};
  for (size_t mib : {1, 3, 8, 9, 16, 17, 31, 64, 100, 128, 129, 256, 300, 512, 1024}) {
    all.push_back(mib * kMiB);
    all.push_back(mib * kMiB + 3);
    all.push_back(mib * kMiB - 256);
  }
  return all;
}

void expect_cover(const Chunks& chunks, size_t bytes, const char* what) {
  ASSERT_GT(chunks.count(), 0u) << what << " " << bytes;
  EXPECT_EQ(chunks.total(), bytes) << what;
  size_t end = 0;
  for (size_t c = 0; c < chunks.count(); ++c) {
    EXPECT_EQ(chunks.offset(c), end) << what << " " << bytes << " chunk " << c;
    EXPECT_GT(chunks.bytes_of(c), 0u) << what << " " << bytes << " chunk " << c;
    end += chunks.bytes_of(c);
    if (c + 1 < chunks.count()) EXPECT_EQ(end % Chunks::kAlignment, 0u) << what << " " << bytes << " chunk " << c;
  }
}

TEST(CopyEngineChunks, EvenChunksCoverThePartInAtLeastTwoOfAtMost64MiB) {
  for (size_t bytes : sizes()) {
    const Chunks chunks = Chunks::even(bytes, 1024);
    expect_cover(chunks, bytes, "even");
    if (bytes >= 2 * Chunks::kAlignment) EXPECT_GE(chunks.count(), 2u) << bytes;
    for (size_t c = 0; c < chunks.count(); ++c) EXPECT_LE(chunks.bytes_of(c), Chunks::kMaxEvenBytes) << bytes;
  }
  EXPECT_EQ(Chunks::even(0, 4).count(), 0u);
  EXPECT_LE(Chunks::even(size_t(1) << 30, 4).count(), 4u);  // the headers' bound wins over the size
}

TEST(CopyEngineChunks, TaperedChunksEndSmallAndStayWithinTheirBound) {
  for (size_t largest : {Chunks::kMaxTaperedBytes, 64 * kMiB, 5 * kMiB, size_t(4096)}) {
    const size_t last = Chunks::last_tapered(largest);
    for (size_t bytes : sizes()) {
      const Chunks chunks = Chunks::tapered(bytes, SIZE_MAX, largest);
      expect_cover(chunks, bytes, "tapered");
      for (size_t c = 0; c < chunks.count(); ++c) {
        EXPECT_LE(chunks.bytes_of(c), largest + last + Chunks::kAlignment) << bytes << " chunk " << c;
        if (c + 1 < chunks.count()) EXPECT_LE(chunks.bytes_of(c), largest + last) << bytes << " chunk " << c;
      }
      if (bytes >= 4 * last) {  // the two last chunks are the small ones (the last keeps the bytes past 256)
        const size_t n = chunks.count();
        EXPECT_EQ(chunks.bytes_of(n - 2), last) << bytes;
        EXPECT_LT(chunks.bytes_of(n - 1), last + Chunks::kAlignment) << bytes;
      }
    }
  }
  // 64 MiB from the end: 8, 8, 16, 32.
  const Chunks four = Chunks::tapered(64 * kMiB, SIZE_MAX, 64 * kMiB);
  ASSERT_EQ(four.count(), 4u);
  EXPECT_EQ(four.bytes_of(0), 32 * kMiB);
  EXPECT_EQ(four.bytes_of(3), 8 * kMiB);
  // Too few headers for the doubling: the chunks grow past the bound instead.
  const Chunks few = Chunks::tapered(1024 * kMiB, 4);
  expect_cover(few, 1024 * kMiB, "tapered, 4 headers");
  EXPECT_LE(few.count(), 4u);
}

}  // namespace
}  // namespace braid::collectives

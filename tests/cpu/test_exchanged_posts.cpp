// The posts of the host exchange of large eager calls (collectives/exchanged_posts.hpp), no GPU needed: every rank
// reads every rank's announcement in rank order; ranks whose calls differ in collective, buffer or size fail with
// kMismatch naming the rank; a call in place on some ranks only reads as such; a malformed post is internal.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/exchanged_posts.hpp"
#include "expect_error.hpp"

namespace braid {
namespace {

using collectives::ExchangedBuffer;
using collectives::exchanged_post;
using collectives::read_exchanged_posts;

constexpr size_t kBytes = (size_t(256) << 20) + 64;

TEST(ExchangedPosts, EveryRankReadsEveryWordInRankOrder) {
  const std::vector<uint64_t> words = {(uint64_t(7) << 40) | 4096, 1, (uint64_t(1) << 63) | 3, 0xffffffffffffull};
  std::vector<std::string> posts;
  for (uint64_t word : words) {
    posts.push_back(exchanged_post(Collective::kAllGather, ExchangedBuffer::kRecv, kBytes, false, word));
  }
  for (int rank = 0; rank < 4; ++rank) {
    const collectives::ExchangedPosts read = read_exchanged_posts(posts, rank);
    EXPECT_EQ(read.words, words);
    EXPECT_TRUE(read.same_placement);
  }
}

TEST(ExchangedPosts, InPlaceOnSomeRanksOnlyReadsAsMixedPlacement) {
  const std::vector<std::string> posts = {
      exchanged_post(Collective::kReduceScatter, ExchangedBuffer::kSend, kBytes, true, 5),
      exchanged_post(Collective::kReduceScatter, ExchangedBuffer::kSend, kBytes, false, 6)};
  EXPECT_FALSE(read_exchanged_posts(posts, 0).same_placement);
  EXPECT_FALSE(read_exchanged_posts(posts, 1).same_placement);
  const std::vector<std::string> all_in_place = {
      exchanged_post(Collective::kReduceScatter, ExchangedBuffer::kSend, kBytes, true, 5),
      exchanged_post(Collective::kReduceScatter, ExchangedBuffer::kSend, kBytes, true, 6)};
  EXPECT_TRUE(read_exchanged_posts(all_in_place, 1).same_placement);
}

TEST(ExchangedPosts, PostsOfAnotherCallAreAMismatchNamingTheRank) {
  const std::string mine = exchanged_post(Collective::kReduceScatter, ExchangedBuffer::kSend, kBytes, false, 9);
  const std::string others[] = {
      exchanged_post(Collective::kAllGather, ExchangedBuffer::kSend, kBytes, false, 9),
      exchanged_post(Collective::kReduceScatter, ExchangedBuffer::kRecv, kBytes, false, 9),
      exchanged_post(Collective::kReduceScatter, ExchangedBuffer::kSend, kBytes * 2, false, 9)};
  for (const std::string& other : others) {
    const std::string message =
        expect_error([&] { read_exchanged_posts({mine, mine, other}, 0); }, ErrorCode::kMismatch);
    EXPECT_NE(message.find("rank 2"), std::string::npos) << message;
    expect_error([&] { read_exchanged_posts({mine, mine, other}, 2); }, ErrorCode::kMismatch);  // seen from rank 2 too
  }
}

TEST(ExchangedPosts, MalformedPostsAreInternalErrors) {
  const std::string good = exchanged_post(Collective::kAllGather, ExchangedBuffer::kRecv, kBytes, false, 9);
  for (const std::string bad : {"", "1 2 3", "1 2 3 4 5", "1 2 3 0 5 6", "x 2 3 0 5"}) {
    expect_error([&] { read_exchanged_posts({good, bad}, 0); }, ErrorCode::kInternal);
  }
}

}  // namespace
}  // namespace braid

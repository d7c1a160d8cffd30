// The host's side of the ErrorWord protocol (braid/device/sync_device.hpp): the fatal word is read and never
// cleared, the data word is taken once and freed, a claimed word that is still being written is not reported,
// and a kernel claiming and publishing while the host takes records neither loses nor tears one.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "braid/device/sync_device.hpp"
#include "sync/device_sync.hpp"

namespace braid {
namespace {

using device::ErrorWord;

// Users' kernels and the host share the struct through host-mapped memory: it must stay plain data.
static_assert(std::is_trivially_copyable_v<ErrorWord>);
static_assert(std::is_standard_layout_v<ErrorWord>);
static_assert(std::is_trivially_default_constructible_v<ErrorWord>);
static_assert(std::is_aggregate_v<ErrorWord>);

// A word as a kernel leaves it after record_data_error: claimed, every field written, code published.
ErrorWord published(unsigned int code) {
  ErrorWord word{};
  word.claimed = 1;
  word.collective = 11;
  word.site = 2;
  word.rank = 3;
  word.peer = 1;
  word.channel = 5;
  word.waited_ns = 123456789ull;
  word.value = 4097;
  word.limit = -4096;
  word.code = code;
  return word;
}

void expect_fields_of(const ErrorWord& seen, const ErrorWord& word) {
  EXPECT_EQ(seen.code, word.code);
  EXPECT_EQ(seen.collective, word.collective);
  EXPECT_EQ(seen.site, word.site);
  EXPECT_EQ(seen.rank, word.rank);
  EXPECT_EQ(seen.peer, word.peer);
  EXPECT_EQ(seen.channel, word.channel);
  EXPECT_EQ(seen.waited_ns, word.waited_ns);
  EXPECT_EQ(seen.value, word.value);
  EXPECT_EQ(seen.limit, word.limit);
}

bool same_bytes(const ErrorWord& a, const ErrorWord& b) { return std::memcmp(&a, &b, sizeof(ErrorWord)) == 0; }

TEST(ErrorWord, AnEmptyWordIsNotReportedAndNotWritten) {
  ErrorWord word{};
  const ErrorWord before = word;
  EXPECT_EQ(read_error_word(&word).code, 0u);
  EXPECT_EQ(take_error_word(&word).code, 0u);
  EXPECT_TRUE(same_bytes(word, before));
}

TEST(ErrorWord, AClaimedWordNotYetPublishedIsLeftToItsKernel) {
  ErrorWord word = published(device::kErrorOverflow);
  word.code = 0;  // claimed, fields written, code not stored yet
  const ErrorWord before = word;
  EXPECT_EQ(read_error_word(&word).code, 0u);
  EXPECT_EQ(take_error_word(&word).code, 0u);
  EXPECT_TRUE(same_bytes(word, before)) << "the host wrote a word a kernel still owns";
  EXPECT_EQ(word.claimed, 1u);
}

TEST(ErrorWord, APublishedDataErrorIsTakenOnceAndTheWordFreed) {
  ErrorWord word = published(device::kErrorCountMismatch);
  const ErrorWord before = word;
  const ErrorWord seen = take_error_word(&word);
  expect_fields_of(seen, before);
  EXPECT_EQ(word.code, 0u);
  EXPECT_EQ(word.claimed, 0u) << "the next failure could never be recorded";
  EXPECT_EQ(take_error_word(&word).code, 0u) << "raised twice";
}

TEST(ErrorWord, TheFatalWordIsReadButNeverCleared) {
  ErrorWord word = published(device::kErrorTimeout);
  const ErrorWord before = word;
  expect_fields_of(read_error_word(&word), before);
  expect_fields_of(read_error_word(&word), before);  // every later call raises it again
  EXPECT_TRUE(same_bytes(word, before));
}

TEST(ErrorWord, OfCallersTakingTogetherExactlyOneGetsTheRecord) {
  constexpr int kCallers = 4;
  for (int round = 0; round < 500; ++round) {
    ErrorWord word = published(device::kErrorOverflow);
    std::atomic<int> ready{0};
    std::atomic<int> got{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < kCallers; ++c) {
      callers.emplace_back([&] {
        ready.fetch_add(1);
        while (ready.load() < kCallers) std::this_thread::yield();
        if (take_error_word(&word).code != 0) got.fetch_add(1);
      });
    }
    for (std::thread& caller : callers) caller.join();
    ASSERT_EQ(got.load(), 1) << "round " << round;
  }
}

// What record_data_error does, on the host: claim, write every field, publish the code (release). Record n's
// fields are all derived from n, so a copy mixing two records shows.
bool record(ErrorWord* word, unsigned int n) {
  unsigned int free = 0;
  if (!std::atomic_ref<unsigned int>(word->claimed).compare_exchange_strong(free, 1, std::memory_order_acquire)) {
    return false;
  }
  word->collective = n;
  word->site = n + 1;
  word->rank = static_cast<int>(n) + 2;
  word->peer = -static_cast<int>(n);
  word->channel = static_cast<int>(n % 64);
  word->waited_ns = n * 3ull;
  word->value = n * 5ll;
  word->limit = -static_cast<long long>(n) * 7;
  std::atomic_ref<unsigned int>(word->code).store(2 + n % 7, std::memory_order_release);
  return true;
}

bool consistent(const ErrorWord& seen) {
  const unsigned int n = seen.collective;
  return seen.code == 2 + n % 7 && seen.site == n + 1 && seen.rank == static_cast<int>(n) + 2 &&
         seen.peer == -static_cast<int>(n) && seen.channel == static_cast<int>(n % 64) && seen.waited_ns == n * 3ull &&
         seen.value == n * 5ll && seen.limit == -static_cast<long long>(n) * 7;
}

TEST(ErrorWord, AKernelRecordingWhileTheHostTakesLosesAndTearsNothing) {
  ErrorWord word{};
  constexpr unsigned int kAttempts = 2000000;
  std::atomic<bool> done{false};
  unsigned int recorded = 0;
  std::thread kernel([&] {
    for (unsigned int n = 1; n <= kAttempts; ++n) recorded += record(&word, n) ? 1 : 0;
    done.store(true);
  });
  unsigned int taken = 0, torn = 0, last = 0, out_of_order = 0;
  auto take = [&] {
    const ErrorWord seen = take_error_word(&word);
    if (seen.code == 0) return;
    ++taken;
    if (!consistent(seen)) ++torn;
    if (seen.collective <= last) ++out_of_order;  // taken twice, or an old record resurfaced
    last = seen.collective;
  };
  while (!done.load()) take();
  kernel.join();
  take();  // the last record, published after the loop's last look
  EXPECT_EQ(torn, 0u);
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_EQ(taken, recorded) << "records were lost";
  EXPECT_EQ(word.code, 0u);
  EXPECT_EQ(word.claimed, 0u) << "the word is stuck: claimed, never to be published";
}

}  // namespace
}  // namespace braid

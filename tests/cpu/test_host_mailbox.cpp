// HostMailbox and HostBoard: ranks are threads of this process, each with its own fd exchanger on a fresh scope, so
// the board travels as it does between processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/fd_passing.hpp"
#include "bootstrap/host_board.hpp"
#include "bootstrap/host_mailbox.hpp"
#include "braid/error.hpp"
#include "expect_error.hpp"
#include "rank_threads.hpp"

namespace braid {
namespace {

constexpr double kTimeoutS = 20.0;  // generous: the ranks are threads on a small, busy machine
constexpr uint64_t kTag = 7;

std::string fresh_scope() {
  static std::atomic<int> counter{0};
  std::random_device random;
  return "mailbox-" + std::to_string(::getpid()) + "-" + std::to_string(random()) + "-" + std::to_string(counter++);
}

// Rank r's post of allgather `call`: lengths from 0 to the most a post holds, every byte value.
std::string post_of(int rank, int call) {
  std::string post(static_cast<size_t>((rank * 37 + call * 11) % (HostMailbox::kMostPostBytes + 1)), '\0');
  for (size_t i = 0; i < post.size(); ++i) post[i] = static_cast<char>((rank * 131 + call * 7 + i) & 0xff);
  return post;
}

class HostMailboxWorld : public ::testing::TestWithParam<int> {};

// Ranks that run ahead by one allgather and ranks that sleep before posting see every post of every call.
TEST_P(HostMailboxWorld, EveryRankReadsEveryPostOfEveryCall) {
  const int size = GetParam();
  const std::string scope = fresh_scope();
  constexpr int kCalls = 2000;
  std::atomic<int> wrong{0};
  run_ranks(all_ranks(size), [&](int rank) {
    FdExchanger fds(scope, rank, size, kTimeoutS);
    HostMailbox mailbox(fds, rank, size, kTag, kTimeoutS);
    std::mt19937 random(static_cast<unsigned>(rank + 1));
    for (int call = 1; call <= kCalls; ++call) {
      if (random() % 200 == 0) std::this_thread::sleep_for(std::chrono::microseconds(random() % 500));
      const std::vector<std::string> posts = mailbox.allgather(post_of(rank, call), "test");
      if (posts.size() != static_cast<size_t>(size)) {
        ++wrong;
        continue;
      }
      for (int r = 0; r < size; ++r) wrong += posts[r] != post_of(r, call);
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, HostMailboxWorld, ::testing::Values(2, 3, 8));

TEST(HostMailbox, ALongerPostIsRefusedNamingTheArgument) {
  const std::string scope = fresh_scope();
  run_ranks(all_ranks(1), [&](int rank) {
    FdExchanger fds(scope, rank, 1, kTimeoutS);
    HostMailbox mailbox(fds, rank, 1, kTag, kTimeoutS);
    const std::string message = expect_error(
        [&] { mailbox.allgather(std::string(HostMailbox::kMostPostBytes + 1, 'x'), "test"); },
        ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("argument 'mine' is 241 bytes; a post holds at most 240"), std::string::npos) << message;
    EXPECT_EQ(mailbox.allgather("alone", "test"), std::vector<std::string>{"alone"});
  });
}

// Rank 1 posts once and stops: rank 0's second allgather times out naming it, with `what` and the call's number.
TEST(HostMailbox, AMissingRankTimesOutNamed) {
  const std::string scope = fresh_scope();
  run_ranks(all_ranks(2), [&](int rank) {
    FdExchanger fds(scope, rank, 2, kTimeoutS);
    HostMailbox mailbox(fds, rank, 2, kTag, 0.3);
    EXPECT_EQ(mailbox.allgather(post_of(rank, 1), "first").size(), 2u);
    if (rank == 1) return;
    const auto start = std::chrono::steady_clock::now();
    const std::string message =
        expect_error([&] { mailbox.allgather("second", "eager call's buffer"); }, ErrorCode::kTimeout);
    EXPECT_NE(message.find("'eager call's buffer' #2: rank(s) 1 did not post within 0.3 s"), std::string::npos)
        << message;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  });
}

// One deadline for the whole allgather, not one a peer: rank 1 posts late, rank 2 never; rank 0 gives up one
// timeout after it posted, naming rank 2 alone.
TEST(HostMailbox, ALatePeerDoesNotExtendTheWaitForAMissingOne) {
  const std::string scope = fresh_scope();
  run_ranks(all_ranks(3), [&](int rank) {
    FdExchanger fds(scope, rank, 3, kTimeoutS);
    HostMailbox mailbox(fds, rank, 3, kTag, 1.0);
    EXPECT_EQ(mailbox.allgather(post_of(rank, 1), "first").size(), 3u);
    if (rank == 2) return;
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(700));
    const auto start = std::chrono::steady_clock::now();
    const std::string message = expect_error([&] { mailbox.allgather("second", "test"); }, ErrorCode::kTimeout);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(message.find("rank(s) 2 did not post within 1 s"), std::string::npos) << message;
    EXPECT_GE(waited, 1.0);
    if (rank == 0) EXPECT_LT(waited, 1.5) << "rank 1's late post restarted the wait for rank 2";
  });
}

// interrupt() from another thread ends a wait with kAborted; the poll hook runs while waiting and its throw ends
// the wait too.
TEST(HostMailbox, InterruptAndPollEndAWait) {
  const std::string scope = fresh_scope();
  run_ranks(all_ranks(2), [&](int rank) {
    FdExchanger fds(scope, rank, 2, kTimeoutS);
    HostMailbox mailbox(fds, rank, 2, kTag, kTimeoutS);
    if (rank == 1) return;  // never posts
    int polls = 0;
    const auto failing_poll = [&polls] {
      if (++polls == 3) throw Error(ErrorCode::kRemoteError, "a peer failed");
    };
    expect_error([&] { mailbox.allgather("a", "polled", failing_poll); }, ErrorCode::kRemoteError);
    EXPECT_EQ(polls, 3);
    std::thread interrupter([&mailbox] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      mailbox.interrupt();
    });
    const std::string message = expect_error([&] { mailbox.allgather("b", "interrupted"); }, ErrorCode::kAborted);
    EXPECT_NE(message.find("'interrupted' #2: the wait for rank 1 ended: the communicator was aborted"), std::string::npos) << message;
    interrupter.join();
  });
}

// A rank whose board is of another size than rank 0's refuses it: the ranks disagree on what they share.
TEST(HostBoard, ABoardOfAnotherSizeIsRefused) {
  const std::string scope = fresh_scope();
  run_ranks(all_ranks(2), [&](int rank) {
    FdExchanger fds(scope, rank, 2, kTimeoutS);
    if (rank == 0) {
      HostBoard board(fds, rank, 2, kTag, 4096, "braid-test-board");
      return;
    }
    const std::string message =
        expect_error([&] { HostBoard board(fds, rank, 2, kTag, 8192, "braid-test-board"); }, ErrorCode::kInternal);
    EXPECT_NE(message.find("braid-test-board: rank 0 passed 4096 bytes, where 8192 sealed bytes were due"),
              std::string::npos)
        << message;
  });
}

// The board is shared: what one rank writes another reads, and it cannot be shrunk under the mappings.
TEST(HostBoard, RanksShareOneSealedMemory) {
  const std::string scope = fresh_scope();
  constexpr size_t kBytes = 4096;
  std::atomic<int> wrong{0};
  std::atomic<int> arrived{0};
  run_ranks(all_ranks(3), [&](int rank) {
    FdExchanger fds(scope, rank, 3, kTimeoutS);
    HostBoard board(fds, rank, 3, kTag, kBytes, "braid-test-board");
    auto* words = static_cast<std::atomic<uint32_t>*>(board.data());
    words[rank].store(static_cast<uint32_t>(rank + 100), std::memory_order_release);
    ++arrived;
    while (arrived.load() < 3) std::this_thread::yield();
    for (int r = 0; r < 3; ++r) wrong += words[r].load(std::memory_order_acquire) != static_cast<uint32_t>(r + 100);
    ++arrived;
    while (arrived.load() < 6) std::this_thread::yield();  // no rank unmaps before every rank read
  });
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace braid

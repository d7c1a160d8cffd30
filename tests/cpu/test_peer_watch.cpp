// PeerWatch (backends/cuda/peer_watch.hpp), without a GPU: a revocation reaches every rank's watch, a peer
// process that exits without destroying its watch is noticed within a second, and one that destroyed it first is
// not. Ranks are threads of this process, or a forked child for the exits.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/peer_watch.hpp"
#include "bootstrap/fd_passing.hpp"
#include "memory/memory_context.hpp"

namespace braid::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTimeoutS = 10.0;

std::string fresh_scope() {
  static std::atomic<int> counter{0};
  std::random_device random;
  return "watch-" + std::to_string(::getpid()) + "-" + std::to_string(random()) + "-" + std::to_string(counter++);
}

std::unique_ptr<MemoryContext> context_of(const std::string& scope, int rank, int size) {
  auto context = std::make_unique<MemoryContext>();
  context->rank = rank;
  context->size = size;
  context->fds = std::make_unique<FdExchanger>(scope, rank, size, kTimeoutS);
  return context;
}

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

TEST(PeerWatch, ARevocationReachesEveryRank) {
  constexpr int kWorld = 3;
  const std::string scope = fresh_scope();
  std::vector<std::atomic<int>> revoked_by(kWorld);
  std::vector<std::atomic<double>> seen_after_ms(kWorld);
  for (int r = 0; r < kWorld; ++r) revoked_by[r] = -1;
  std::atomic<int> ready{0};
  std::atomic<bool> revoked{false};
  std::atomic<Clock::rep> revoked_at{0};  // Clock ticks
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      std::unique_ptr<MemoryContext> context = context_of(scope, rank, kWorld);
      PeerWatch watch(*context, std::vector<int>(kWorld, 0), [](int, int) { ADD_FAILURE() << "no rank exited"; },
                      [&, rank](int by) {
                        revoked_by[rank] = by;
                        seen_after_ms[rank] = milliseconds_since(Clock::time_point(Clock::duration(revoked_at.load())));
                      });
      ++ready;
      while (ready.load() < kWorld) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (rank == 1) {
        revoked_at = Clock::now().time_since_epoch().count();
        revoked = true;
        EXPECT_TRUE(watch.revoke());
        EXPECT_FALSE(watch.revoke()) << "a second revocation";
      }
      const Clock::time_point start = Clock::now();
      while (revoked_by[rank].load() < 0 && milliseconds_since(start) < 1000) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      while (!revoked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      // Stays in scope until every rank saw it: the board lives as long as some rank maps it.
      ++ready;
      while (ready.load() < 2 * kWorld) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(revoked_by[rank].load(), 1) << "rank " << rank;
    // The watch looks every 10 ms; a loaded machine may delay its thread, so the bound here is loose (the GPU
    // fault suite holds the 100 ms goal).
    EXPECT_LT(seen_after_ms[rank].load(), 1000.0) << "rank " << rank;
    std::printf("[peer watch] rank %d saw the revocation after %.1f ms\n", rank, seen_after_ms[rank].load());
  }
}

// Whether this kernel (Linux 5.3+) and its seccomp filter let a process open a pidfd.
bool pidfds_work() {
#ifdef SYS_pidfd_open
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  if (fd < 0) return false;
  ::close(fd);
  return true;
#else
  return false;
#endif
}

// Rank 1 is a forked child that makes its watch and then exits, with or without destroying it first.
void watch_a_child(bool destroy_first, double* noticed_after_ms) {
  const std::string scope = fresh_scope();
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(go[1]);
    std::unique_ptr<MemoryContext> context = context_of(scope, 1, 2);
    auto watch = std::make_unique<PeerWatch>(*context, std::vector<int>{static_cast<int>(::getppid()), 0},
                                             [](int, int) {}, [](int) {});
    char byte = 0;
    if (::read(go[0], &byte, 1) != 1) ::_exit(3);  // until the parent's watch is made
    if (destroy_first) watch.reset();
    ::_exit(0);
  }
  ::close(go[0]);
  std::atomic<double> noticed{-1};
  Clock::time_point exited_at;
  std::atomic<bool> exited{false};
  {
    std::unique_ptr<MemoryContext> context = context_of(scope, 0, 2);
    PeerWatch watch(*context, std::vector<int>{0, static_cast<int>(child)},
                    [&](int rank, int pid) {
                      EXPECT_EQ(rank, 1);
                      EXPECT_EQ(pid, child);
                      while (!exited.load()) std::this_thread::yield();
                      noticed = milliseconds_since(exited_at);
                    },
                    [](int) { ADD_FAILURE() << "nobody revoked"; });
    ASSERT_EQ(::write(go[1], "x", 1), 1);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    exited_at = Clock::now();
    exited = true;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    const Clock::time_point start = Clock::now();
    // As long as a real exit takes to be noticed at most (1 s), so a false report within that bound shows too.
    while (noticed.load() < 0 && milliseconds_since(start) < (destroy_first ? 1200 : 1000)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ::close(go[1]);
  *noticed_after_ms = noticed.load();
}

TEST(PeerWatch, APeerProcessThatExitsIsNoticedWithinASecond) {
  if (!pidfds_work()) GTEST_SKIP() << "pidfd_open is not available here: exits are noticed only by the timeout";
  double noticed_after_ms = -1;
  watch_a_child(false, &noticed_after_ms);
  EXPECT_GE(noticed_after_ms, 0.0) << "the exit was not noticed within a second";
  EXPECT_LT(noticed_after_ms, 1000.0);
}

TEST(PeerWatch, APeerThatDestroyedItsWatchBeforeExitingIsNoFailure) {
  if (!pidfds_work()) GTEST_SKIP() << "pidfd_open is not available here";
  double noticed_after_ms = -1;
  watch_a_child(true, &noticed_after_ms);
  EXPECT_LT(noticed_after_ms, 0.0) << "a clean departure was reported as an exit";
}

}  // namespace
}  // namespace braid::detail

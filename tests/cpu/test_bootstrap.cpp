// Host-side collectives over the store, with ranks as threads (each with its own store connection).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store.hpp"
#include "braid/error.hpp"
#include "rank_threads.hpp"

namespace braid {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::shared_ptr<StoreClient> connect_to(const StoreServer& server) {
  return std::make_shared<StoreClient>("127.0.0.1", server.port(), 5.0);
}

// Rank r's contribution to call `call`: varied lengths, binary bytes included.
std::string contribution(int rank, int call) {
  std::string value = fmt::format("rank {} call {}", rank, call);
  value.push_back('\0');
  value.append(static_cast<size_t>((rank * 31 + call) % 200), static_cast<char>(0x80 + rank));
  return value;
}

class BootstrapWorld : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapWorld, AllgatherRepeatedAndCleanedUp) {
  const int size = GetParam();
  constexpr int kCalls = 100;
  StoreServer server;
  std::atomic<int> mismatches{0};
  run_ranks(all_ranks(size), [&](int rank) {
    Bootstrap bootstrap(connect_to(server), "job", rank, size, 5.0);
    for (int call = 1; call <= kCalls; ++call) {
      const std::vector<std::string> all = bootstrap.allgather(contribution(rank, call), "repeat");
      if (all.size() != size_t(size)) ++mismatches;
      for (int peer = 0; peer < size && peer < int(all.size()); ++peer) {
        if (all[peer] != contribution(peer, call)) ++mismatches;
      }
    }
  });
  EXPECT_EQ(mismatches.load(), 0);

  // Keys are "<prefix>/<call>/<rank>" (bootstrap.cpp). Only the last call's survive: the store does not
  // grow with the number of calls.
  auto checker = connect_to(server);
  int leftovers = 0;
  for (int call = 1; call < kCalls; ++call) {
    for (int rank = 0; rank < size; ++rank) leftovers += checker->try_get(fmt::format("job/{}/{}", call, rank)).has_value();
  }
  EXPECT_EQ(leftovers, 0);
  if (size > 1) EXPECT_EQ(checker->try_get(fmt::format("job/{}/0", kCalls)), contribution(0, kCalls));
}

TEST_P(BootstrapWorld, BroadcastFromEveryRoot) {
  const int size = GetParam();
  StoreServer server;
  std::atomic<int> mismatches{0};
  run_ranks(all_ranks(size), [&](int rank) {
    Bootstrap bootstrap(connect_to(server), "bc", rank, size, 5.0);
    for (int round = 0; round < 3; ++round) {
      for (int root = 0; root < size; ++root) {
        const std::string expected = fmt::format("from {} round {}", root, round);
        const std::string mine = rank == root ? expected : "not this";
        if (bootstrap.broadcast(mine, root, "test") != expected) ++mismatches;
      }
    }
  });
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_P(BootstrapWorld, BarrierSeparatesPhases) {
  const int size = GetParam();
  constexpr int kPhases = 20;
  StoreServer server;
  std::atomic<int> arrived{0};
  std::atomic<int> violations{0};
  run_ranks(all_ranks(size), [&](int rank) {
    Bootstrap bootstrap(connect_to(server), "barrier", rank, size, 5.0);
    for (int phase = 0; phase < kPhases; ++phase) {
      if (rank == phase % size) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a laggard
      ++arrived;
      bootstrap.barrier("phase");
      // Everyone arrived for this phase; nobody can be past the next barrier yet.
      const int now = arrived.load();
      if (now < size * (phase + 1) || now > size * (phase + 2)) ++violations;
    }
  });
  EXPECT_EQ(violations.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Bootstrap, BootstrapWorld, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "N" + std::to_string(info.param); });

// Ranks in `present` of a world of `size` call `call`; each must get kTimeout; returns their messages.
std::vector<std::string> timeouts_with_missing_ranks(int size, const std::vector<int>& present, double timeout_s,
                                                     const std::function<void(Bootstrap&)>& call) {
  StoreServer server;
  std::mutex mutex;
  std::vector<std::string> messages;
  const auto start = Clock::now();
  run_ranks(present, [&](int rank) {
    Bootstrap bootstrap(connect_to(server), "missing", rank, size, timeout_s);
    try {
      call(bootstrap);
      ADD_FAILURE() << "rank " << rank << " finished a collective that a rank never joined";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kTimeout) << error.what();
      std::lock_guard lock(mutex);
      messages.push_back(error.what());
    }
  });
  const double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, timeout_s * 0.9);
  EXPECT_LT(elapsed, timeout_s + 2.0);
  EXPECT_EQ(messages.size(), present.size());
  return messages;
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(BootstrapTest, MissingRankIsNamed) {
  const auto messages = timeouts_with_missing_ranks(
      4, {0, 1, 3}, 1.0, [](Bootstrap& b) { b.allgather("x", "symmetric alloc"); });
  for (const std::string& message : messages) {
    expect_contains(message, "bootstrap allgather 'symmetric alloc' #1: rank(s) 2 did not arrive within 1 s");
    expect_contains(message, "(store 127.0.0.1:");
  }
}

TEST(BootstrapTest, SeveralMissingRanksAreNamed) {
  const auto messages = timeouts_with_missing_ranks(4, {0, 1}, 1.0, [](Bootstrap& b) { b.barrier(); });
  for (const std::string& message : messages) expect_contains(message, "rank(s) 2, 3 did not arrive");
}

TEST(BootstrapTest, BroadcastTimeoutNamesTheRoot) {
  const auto messages =
      timeouts_with_missing_ranks(3, {0, 1}, 1.0, [](Bootstrap& b) { b.broadcast("", 2, "unique id"); });
  for (const std::string& message : messages) {
    expect_contains(message, "broadcast 'unique id' #1 from root 2: rank(s) 2 did not arrive");
  }
}

TEST(BootstrapTest, TimeoutInALaterCallNamesItsSequence) {
  // Rank 1 takes part in the first call only; rank 0's second call reports #2.
  StoreServer server;
  std::string message;
  run_ranks({0, 1}, [&](int rank) {
    Bootstrap bootstrap(connect_to(server), "later", rank, 2, 1.0);
    bootstrap.allgather("first", "first");
    if (rank == 1) return;
    try {
      bootstrap.allgather("second", "second");
    } catch (const Error& error) {
      message = error.what();
    }
  });
  expect_contains(message, "allgather 'second' #2: rank(s) 1 did not arrive");
}

// A polled allgather (what large eager calls use): the same results, the poll runs while a rank is late, and a
// poll that throws ends the wait at once with its error, long before the timeout.
TEST(BootstrapTest, PolledAllgatherGathersAndPollsWhileWaiting) {
  StoreServer server;
  std::atomic<int> polls{0}, mismatches{0};
  run_ranks({0, 1, 2}, [&](int rank) {
    Bootstrap bootstrap(connect_to(server), "polled", rank, 3, 5.0);
    for (int call = 1; call <= 20; ++call) {
      if (rank == 2 && call == 3) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const std::vector<std::string> all =
          bootstrap.allgather(contribution(rank, call), "polled", [&] { ++polls; });
      for (int peer = 0; peer < 3; ++peer) {
        if (all[peer] != contribution(peer, call)) ++mismatches;
      }
    }
  });
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GE(polls.load(), 2);  // ranks 0 and 1 waited about 300 ms for rank 2, polling every 50 ms
}

TEST(BootstrapTest, PollThatThrowsEndsTheWait) {
  StoreServer server;
  std::string message;
  double elapsed = 0;
  run_ranks({0}, [&](int rank) {
    Bootstrap bootstrap(connect_to(server), "poll-throws", rank, 2, 30.0);  // rank 1 never comes
    const auto start = Clock::now();
    int polls = 0;
    try {
      bootstrap.allgather("x", "poll", [&] {
        if (++polls == 3) throw Error(ErrorCode::kRemoteError, "a peer failed");
      });
    } catch (const Error& error) {
      message = error.what();
    }
    elapsed = seconds_since(start);
  });
  expect_contains(message, "a peer failed");
  EXPECT_LT(elapsed, 5.0);
}

// A barrier whose store wait another thread ends (a revocation the peer watch saw: NOTE [ended host waits]) raises
// the interruption's code, the call named before the store's message.
TEST(BootstrapTest, AnEndedStoreWaitKeepsItsCodeAndNamesTheCall) {
  StoreServer server;
  auto store = connect_to(server);
  Bootstrap bootstrap(store, "ended", 0, 2, 30.0);  // rank 1 never comes
  std::thread revoker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    store->interrupt(ErrorCode::kRevoked, "rank 1 revoked the communicator");
  });
  const auto start = Clock::now();
  try {
    bootstrap.barrier("Communicator::barrier");
    ADD_FAILURE() << "the barrier outlived the interrupt";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kRevoked) << error.what();
    expect_contains(error.what(), "bootstrap barrier 'Communicator::barrier' #1: store 127.0.0.1:");
    expect_contains(error.what(), "ended: rank 1 revoked the communicator");
  }
  revoker.join();
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(BootstrapTest, PolledAllgatherTimesOutNamingTheRank) {
  const auto messages = timeouts_with_missing_ranks(
      3, {0, 2}, 1.0, [](Bootstrap& b) { b.allgather("x", "eager call's buffer", [] {}); });
  for (const std::string& message : messages) expect_contains(message, "rank(s) 1 did not arrive within 1 s");
}

TEST(BootstrapTest, BadArgumentsRejected) {
  StoreServer server;
  auto store = connect_to(server);
  Bootstrap bootstrap(store, "bad", 0, 2, 1.0);
  for (int root : {-1, 2}) {
    try {
      bootstrap.broadcast("v", root);
      ADD_FAILURE() << "root " << root << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      expect_contains(error.what(), "'root'");
    }
  }
  auto expect_invalid = [&](const std::function<void()>& make, const char* argument) {
    try {
      make();
      ADD_FAILURE() << "bad " << argument << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      expect_contains(error.what(), fmt::format("'{}'", argument));
    }
  };
  expect_invalid([&] { Bootstrap(store, "p", 2, 2, 1.0); }, "rank");
  expect_invalid([&] { Bootstrap(store, "p", -1, 2, 1.0); }, "rank");
  expect_invalid([&] { Bootstrap(store, "p", 0, 0, 1.0); }, "size");
  expect_invalid([&] { Bootstrap(nullptr, "p", 0, 1, 1.0); }, "store");
  expect_invalid([&] { Bootstrap(store, "p", 0, 1, 0.0); }, "timeout_s");
}

TEST(BootstrapTest, PrefixesKeepGroupsApart) {
  // Two communicators on one store, both at call #1, #2, ...: their keys must not mix.
  StoreServer server;
  std::atomic<int> mismatches{0};
  run_ranks(all_ranks(4), [&](int thread) {
    const int group = thread / 2, rank = thread % 2;
    Bootstrap bootstrap(connect_to(server), fmt::format("group{}", group), rank, 2, 5.0);
    for (int call = 0; call < 20; ++call) {
      const auto all = bootstrap.allgather(fmt::format("g{} r{} c{}", group, rank, call));
      for (int peer = 0; peer < 2; ++peer) {
        if (all[peer] != fmt::format("g{} r{} c{}", group, peer, call)) ++mismatches;
      }
    }
  });
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace braid

// ExposureService (src/memory/exposure.hpp): ranks as threads over one in-process store, with a fake importer
// that records what each rank's helper was sent.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.hpp"
#include "core/error.hpp"
#include "memory/exposure.hpp"
#include "rank_threads.hpp"

namespace braid::detail {
namespace {

// The address a helper hands out for (owner, id): distinct for every pair, and checkable by the owner's test.
uintptr_t fake_address(int owner, uint64_t id) { return (uintptr_t(owner + 1) << 40) | (id << 4); }

class FakeImporter : public ExposureImporter {
 public:
  explicit FakeImporter(int refuse_owner = -1) : refuse_owner_(refuse_owner) {}
  uintptr_t import(int owner, uint64_t id, const std::string& descriptor) override {
    if (owner == refuse_owner_) raise(ErrorCode::kUnsupported, "cannot map {} bytes of rank {}", descriptor.size(), owner);
    std::lock_guard<std::mutex> lock(mutex_);
    descriptors_[{owner, id}] = descriptor;
    return fake_address(owner, id);
  }
  void release(int owner, uint64_t id) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    released_.insert({owner, id});
  }
  std::string descriptor(int owner, uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = descriptors_.find({owner, id});
    return it == descriptors_.end() ? "" : it->second;
  }
  size_t released() {
    std::lock_guard<std::mutex> lock(mutex_);
    return released_.size();
  }

 private:
  int refuse_owner_;
  std::mutex mutex_;
  std::map<std::pair<int, uint64_t>, std::string> descriptors_;
  std::set<std::pair<int, uint64_t>> released_;
};

std::function<std::unique_ptr<StoreClient>()> connector(const StoreServer& server) {
  const int port = server.port();
  return [port] { return std::make_unique<StoreClient>("127.0.0.1", port, 5.0); };
}

// One service a rank, each with its own importer, waiting 5 s for answers.
std::vector<std::unique_ptr<ExposureService>> services_of(const StoreServer& server,
                                                          std::vector<FakeImporter>& importers) {
  const int size = static_cast<int>(importers.size());
  std::vector<std::unique_ptr<ExposureService>> services(size);
  for (int rank = 0; rank < size; ++rank) {
    services[rank] = std::make_unique<ExposureService>(connector(server), "job", rank, size, 5.0, importers[rank]);
  }
  return services;
}

// A descriptor with binary bytes and a newline, as a packed MemoryDescriptor may hold.
std::string descriptor_of(int rank, int n) {
  std::string bytes = "range " + std::to_string(rank) + "/" + std::to_string(n) + "\n";
  bytes.push_back('\0');
  bytes.append(static_cast<size_t>(17 * n + rank), static_cast<char>(0xA0 + rank));
  return bytes;
}

// Waits (bounded) until every rank has reached the same point: a host barrier for the test's ranks.
class Latch {
 public:
  explicit Latch(int count) : count_(count) {}
  void arrive_and_wait() {
    ++arrived_;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived_ < count_ && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GE(arrived_.load(), count_) << "a rank did not reach the latch in 10 s";
  }

 private:
  const int count_;
  std::atomic<int> arrived_{0};
};

TEST(Exposure, EveryPeerImportsAnExposedRangeAndReleasesItOnWithdrawal) {
  constexpr int kSize = 4, kRanges = 3;
  StoreServer server;
  std::vector<FakeImporter> importers(kSize);
  std::vector<std::unique_ptr<ExposureService>> services = services_of(server, importers);
  std::vector<std::vector<uint64_t>> ids(kSize);
  run_ranks(all_ranks(kSize), [&](int rank) {
    for (int n = 0; n < kRanges; ++n) {
      const ExposureService::Exposure exposure = services[rank]->expose(descriptor_of(rank, n));
      EXPECT_TRUE(exposure.everywhere()) << exposure.reasons;
      ids[rank].push_back(exposure.id);
      // Every peer holds it once expose returned, with the descriptor as sent.
      for (int peer = 0; peer < kSize; ++peer) {
        if (peer == rank) continue;
        EXPECT_EQ(services[peer]->imported(rank, exposure.id), fake_address(rank, exposure.id));
        EXPECT_EQ(importers[peer].descriptor(rank, exposure.id), descriptor_of(rank, n));
      }
    }
  });
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_EQ(std::set<uint64_t>(ids[rank].begin(), ids[rank].end()).size(), size_t(kRanges)) << "ids are distinct";
    EXPECT_EQ(services[rank]->imported_count(), size_t((kSize - 1) * kRanges));
    EXPECT_FALSE(services[rank]->imported(rank, ids[rank][0])) << "a rank never imports its own range";
  }
  run_ranks(all_ranks(kSize), [&](int rank) {
    for (uint64_t id : ids[rank]) {
      services[rank]->withdraw(id);
      for (int peer = 0; peer < kSize; ++peer) {
        if (peer != rank) EXPECT_FALSE(services[peer]->imported(rank, id)) << "withdraw returned before the release";
      }
    }
  });
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_EQ(services[rank]->imported_count(), 0u);
    EXPECT_EQ(importers[rank].released(), size_t((kSize - 1) * kRanges));
  }
}

TEST(Exposure, APeerThatCannotImportIsNamedWithItsReason) {
  constexpr int kSize = 3;
  StoreServer server;
  FakeImporter plain, refusing(/*refuse_owner=*/0);
  ExposureService zero(connector(server), "job", 0, kSize, 5.0, plain);
  ExposureService one(connector(server), "job", 1, kSize, 5.0, plain);
  ExposureService two(connector(server), "job", 2, kSize, 5.0, refusing);
  const ExposureService::Exposure exposure = zero.expose(descriptor_of(0, 1));
  EXPECT_FALSE(exposure.everywhere());
  EXPECT_EQ(exposure.refused, std::vector<int>{2});
  EXPECT_NE(exposure.reasons.find("rank 2: cannot map"), std::string::npos) << exposure.reasons;
  EXPECT_TRUE(one.imported(0, exposure.id));
  EXPECT_FALSE(two.imported(0, exposure.id));
  zero.withdraw(exposure.id);  // the peer that refused answers too
  EXPECT_FALSE(one.imported(0, exposure.id));
}

TEST(Exposure, ASilentPeerIsRefusedOnExposureAndNamedOnWithdrawal) {
  constexpr int kSize = 3;
  StoreServer server;
  FakeImporter importer;
  ExposureService zero(connector(server), "job", 0, kSize, 0.5, importer);
  ExposureService one(connector(server), "job", 1, kSize, 0.5, importer);  // rank 2 never starts its helper
  const ExposureService::Exposure exposure = zero.expose(descriptor_of(0, 0));
  EXPECT_EQ(exposure.refused, std::vector<int>{2});
  EXPECT_NE(exposure.reasons.find("rank 2: did not answer within 0.5 s"), std::string::npos) << exposure.reasons;
  EXPECT_TRUE(one.imported(0, exposure.id));
  try {
    zero.withdraw(exposure.id);
    ADD_FAILURE() << "withdraw returned though rank 2 never answered";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(error.what()).find("rank(s) 2 did not answer"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(one.imported(0, exposure.id)) << "the peers that answered released it";
}

TEST(Exposure, APeerWhoseServiceIsGoneCountsAsAnsweredAtOnce) {
  constexpr int kSize = 3;
  StoreServer server;
  FakeImporter importer;
  ExposureService zero(connector(server), "job", 0, kSize, 30.0, importer);
  ExposureService one(connector(server), "job", 1, kSize, 30.0, importer);
  auto two = std::make_unique<ExposureService>(connector(server), "job", 2, kSize, 30.0, importer);
  uint64_t announced = 0;
  const ExposureService::Exposure held = zero.expose(descriptor_of(0, 0), [&](uint64_t id) { announced = id; });
  EXPECT_TRUE(held.everywhere()) << held.reasons;
  EXPECT_EQ(announced, held.id) << "before_post is called with the exposure's id";
  two.reset();  // rank 2's communicator goes
  const auto started = std::chrono::steady_clock::now();
  zero.withdraw(held.id);  // rank 2 holds nothing any more: no timeout
  const ExposureService::Exposure late = zero.expose(descriptor_of(0, 1));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 5.0)
      << "waited for a peer that is gone";
  EXPECT_EQ(late.refused, std::vector<int>{2});
  EXPECT_NE(late.reasons.find("rank 2: its communicator is gone"), std::string::npos) << late.reasons;
  EXPECT_TRUE(one.imported(0, late.id));
  zero.withdraw(late.id);
}

TEST(Exposure, ConcurrentExposuresAndWithdrawalsFromEveryRankLeaveNothingImported) {
  constexpr int kSize = 4, kRounds = 25;
  StoreServer server;
  std::vector<FakeImporter> importers(kSize);
  std::vector<std::unique_ptr<ExposureService>> services = services_of(server, importers);
  Latch start(kSize * 2);
  run_ranks(all_ranks(kSize * 2), [&](int thread) {  // two threads a rank, each exposing and withdrawing at once
    const int rank = thread % kSize;
    start.arrive_and_wait();
    for (int round = 0; round < kRounds; ++round) {
      const ExposureService::Exposure exposure = services[rank]->expose(descriptor_of(rank, round));
      EXPECT_TRUE(exposure.everywhere()) << exposure.reasons;
      services[rank]->withdraw(exposure.id);
    }
  });
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_EQ(services[rank]->imported_count(), 0u);
    EXPECT_EQ(importers[rank].released(), size_t((kSize - 1) * 2 * kRounds));
  }
}

TEST(Exposure, OneRankExposesToNobodyAndTheHelperStopsPromptly) {
  StoreServer server;
  FakeImporter importer;
  const auto started = std::chrono::steady_clock::now();
  {
    ExposureService alone(connector(server), "job", 0, 1, 5.0, importer);
    const ExposureService::Exposure exposure = alone.expose("x");
    EXPECT_TRUE(exposure.everywhere());
    alone.withdraw(exposure.id);
  }  // the helper sits in a blocking read: the destructor must end it, not wait it out
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 2.0);
}

// NOTE [exposure ids]: a long-lived range keeps its slot while the ranges after it come and go.
TEST(ExposureIds, ALongLivedRangeKeepsItsSlotWhileLaterRangesComeAndGo) {
  ExposureIds ids(8);
  const uint64_t kept = ids.take();
  uint64_t previous = kept;
  for (int round = 0; round < 50; ++round) {  // more than 6 times around the slots
    const uint64_t id = ids.take();
    EXPECT_GT(id, previous) << "ids are serial, never reused";
    EXPECT_NE(id % 8, kept % 8) << "round " << round << ": id " << id << " takes the slot of the live id " << kept;
    ids.release(id);
    previous = id;
  }
  EXPECT_EQ(ids.held(), 1u);
}

TEST(ExposureIds, EverySlotHeldGivesTheNextIdHoldingNothing) {
  ExposureIds ids(4);
  std::set<uint64_t> slots;
  for (int i = 0; i < 4; ++i) slots.insert(ids.take() % 4);
  EXPECT_EQ(slots.size(), 4u);
  const uint64_t overflow = ids.take();
  EXPECT_EQ(overflow, 5u);
  EXPECT_EQ(ids.held(), 4u);
  ids.release(overflow);  // it held nothing: the live range in its slot keeps it
  EXPECT_EQ(ids.held(), 4u);
  ids.release(2);
  EXPECT_EQ(ids.held(), 3u);
  EXPECT_EQ(ids.take(), 6u) << "the next id in the freed slot";
  EXPECT_EQ(ids.held(), 4u);
}

TEST(ExposureIds, ReleasingAnUnknownOrAlreadyReleasedIdChangesNothing) {
  ExposureIds ids(8);
  const uint64_t a = ids.take(), b = ids.take();
  ids.release(a);
  ids.release(a);
  ids.release(b + 8);  // b's slot, another id
  EXPECT_EQ(ids.held(), 1u);
  ids.release(b);
  EXPECT_EQ(ids.held(), 0u);
}

}  // namespace
}  // namespace braid::detail

// braid/device/sync_device.hpp from kernels of the test's own, on a signal pad built as docs/api.md tells a user to
// build one: barriers that carry data between blocks of every rank (eager and in a CUDA graph), signal and wait
// alone around a ring on several channels at once, and the failures a user's host reads from the pad's error
// words: a wait's timeout, a stopped rank's answer at a barrier, plans that differ at a barrier and at a wait with
// a PlanCheck, and refused data recorded once until the host clears it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "braid/device/sync_device.hpp"
#include "collective_reference.hpp"
#include "user_pad_kernel.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr unsigned char kPoison = 0xA5;

// docs/api.md's make_pad, with every CUDA call checked and what it allocates owned. The error words are freed with
// cudaFreeHost, which waits for the whole device: a test ends with device_synchronize() before its pads go.
class UserPad {
 public:
  UserPad(Communicator& comm, int channels, unsigned long long timeout_ns, bool with_stopped)
      : counters_(comm.alloc(3 * static_cast<size_t>(channels) * comm.size() * sizeof(uint64_t))),
        expected_(static_cast<size_t>(channels) * comm.size() * sizeof(uint64_t)),
        stopped_(sizeof(unsigned int)) {
    cuda_check(cudaMemset(expected_.get(), 0, expected_.bytes()), "cudaMemset (expected counts)");
    cuda_check(cudaMemset(stopped_.get(), 0, stopped_.bytes()), "cudaMemset (stopped)");
    cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&errors_), 2 * sizeof(device::ErrorWord), cudaHostAllocMapped),
               "cudaHostAlloc (error words)");
    errors_[0] = device::ErrorWord{};
    errors_[1] = device::ErrorWord{};
    device::ErrorWord* device_errors = nullptr;
    cuda_check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_errors), errors_, 0),
               "cudaHostGetDevicePointer (error words)");
    pad_.local = static_cast<uint64_t*>(counters_.local());
    pad_.peers = reinterpret_cast<uint64_t* const*>(counters_.device_peers());
    pad_.expected = static_cast<uint64_t*>(expected_.get());
    pad_.error = device_errors;
    pad_.data_error = device_errors + 1;
    pad_.rank = comm.rank();
    pad_.world = comm.size();
    pad_.channels = channels;
    pad_.timeout_ns = timeout_ns;
    pad_.stopped = with_stopped ? static_cast<unsigned int*>(stopped_.get()) : nullptr;
  }
  ~UserPad() { cudaFreeHost(errors_); }
  UserPad(const UserPad&) = delete;
  UserPad& operator=(const UserPad&) = delete;

  const device::SignalPad& pad() const { return pad_; }

  // The fatal word as the host reads it: `code` with acquire, the fields only when it is nonzero.
  device::ErrorWord fatal() const { return read(errors_[0]); }
  device::ErrorWord data_error() const { return read(errors_[1]); }

  // Takes the data-error record and frees the word for the next one (the clearing sync_device.hpp prescribes).
  device::ErrorWord take_data_error() {
    device::ErrorWord& word = errors_[1];
    device::ErrorWord taken{};
    taken.code = __atomic_exchange_n(&word.code, 0u, __ATOMIC_ACQ_REL);
    if (taken.code == 0) return taken;
    copy_fields(word, taken);
    __atomic_store_n(&word.claimed, 0u, __ATOMIC_RELEASE);
    return taken;
  }

  unsigned int stopped() const {
    unsigned int value = 0;
    cuda_check(cudaMemcpy(&value, stopped_.get(), sizeof(value), cudaMemcpyDeviceToHost), "cudaMemcpy (stopped)");
    return value;
  }

 private:
  static void copy_fields(const device::ErrorWord& from, device::ErrorWord& to) {
    to.claimed = from.claimed;
    to.collective = from.collective;
    to.site = from.site;
    to.rank = from.rank;
    to.peer = from.peer;
    to.channel = from.channel;
    to.waited_ns = from.waited_ns;
    to.value = from.value;
    to.limit = from.limit;
  }
  static device::ErrorWord read(const device::ErrorWord& word) {
    device::ErrorWord seen{};
    seen.code = __atomic_load_n(&word.code, __ATOMIC_ACQUIRE);
    if (seen.code != 0) copy_fields(word, seen);
    return seen;
  }

  SymmetricMemory counters_;
  DeviceBuffer expected_;
  DeviceBuffer stopped_;
  device::ErrorWord* errors_ = nullptr;
  device::SignalPad pad_{};
};

unsigned long long timeout_ns_of(const Communicator& comm) {
  return static_cast<unsigned long long>(comm.timeout_s() * 1e9);
}

std::string describe(const device::ErrorWord& word) {
  return "code " + std::to_string(word.code) + ", collective " + std::to_string(word.collective) + ", site " +
         std::to_string(word.site) + ", rank " + std::to_string(word.rank) + ", peer " + std::to_string(word.peer) +
         ", channel " + std::to_string(word.channel) + ", waited " + std::to_string(word.waited_ns) + " ns, value " +
         std::to_string(word.value) + ", limit " + std::to_string(word.limit);
}

// What a test expects of a record, every field but waited_ns (a timeout's is at least its bound; 0 elsewhere).
struct Record {
  unsigned int code, collective, site;
  int rank, peer, channel;
  long long value, limit;
};

void expect_record(const device::ErrorWord& word, const Record& want, const std::string& what) {
  const std::string seen = what + ": " + describe(word);
  EXPECT_EQ(word.code, want.code) << seen;
  EXPECT_EQ(word.collective, want.collective) << seen;
  EXPECT_EQ(word.site, want.site) << seen;
  EXPECT_EQ(word.rank, want.rank) << seen;
  EXPECT_EQ(word.peer, want.peer) << seen;
  EXPECT_EQ(word.channel, want.channel) << seen;
  EXPECT_EQ(word.value, want.value) << seen;
  EXPECT_EQ(word.limit, want.limit) << seen;
}

std::vector<unsigned char> slice_bytes(uint64_t key, int rank, size_t bytes) {
  std::vector<unsigned char> out(bytes);
  const uint64_t rank_key = mix64(key ^ (0x5107ull + static_cast<uint64_t>(rank)));
  for (size_t i = 0; i < bytes; ++i) {
    out[i] = static_cast<unsigned char>(mix64(rank_key + i) >> 11);
    if (out[i] == kPoison) out[i] ^= 1;
  }
  return out;
}

int read_flag(const DeviceBuffer& flag) {
  int value = -1;
  cuda_check(cudaMemcpy(&value, flag.get(), sizeof(value), cudaMemcpyDeviceToHost), "cudaMemcpy (flag)");
  return value;
}

// Four blocks on four channels move every rank's slice to every rank through barriers: sizes of one byte (three
// blocks with nothing to copy), odd and above a MiB; two eager rounds, then two replays of a captured launch,
// each round on fresh data and a poisoned output. Every byte of every rank's slice arrives, and none else.
TEST(UserSignalPad, BarriersCarryEveryRanksSliceEagerlyAndInGraphs) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    constexpr int kBlocks = 4;
    constexpr size_t kMaxBytes = (size_t(1) << 20) + 3;
    const int world = comm.size(), rank = comm.rank();
    {
      UserPad user(comm, kBlocks, timeout_ns_of(comm), /*with_stopped=*/false);
      SymmetricMemory slots = comm.alloc(world * kMaxBytes);
      DeviceBuffer mine(kMaxBytes), gathered(world * kMaxBytes);
      const StreamHandle stream;
      const uint64_t seed = shared_seed(comm);
      int round = 0;
      for (size_t bytes : {size_t(1), size_t(4099), kMaxBytes}) {
        const auto enqueue = [&] {
          cuda_check(cudaMemsetAsync(gathered.get(), kPoison, world * kMaxBytes, stream.get()), "poison");
          cuda_check(launch_gather_slices(user.pad(), reinterpret_cast<char* const*>(slots.device_peers()),
                                          static_cast<const char*>(mine.get()), bytes,
                                          static_cast<char*>(gathered.get()), kBlocks, stream.get()),
                     "launch gather_slices");
        };
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        for (int use = 0; use < 4; ++use, ++round) {
          const bool replay = use >= 2;
          const uint64_t key = seed + static_cast<uint64_t>(round) * 7919;
          const std::vector<unsigned char> input = slice_bytes(key, rank, bytes);
          cuda_check(cudaMemcpy(mine.get(), input.data(), bytes, cudaMemcpyHostToDevice), "input");
          if (!replay) {
            enqueue();
            cuda_check(cudaStreamSynchronize(stream.get()), "gather_slices");
          } else {
            if (exec == nullptr) {
              cuda_check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "begin capture");
              enqueue();
              cuda_check(cudaStreamEndCapture(stream.get(), &graph), "end capture");
              exec = instantiate_on_every_rank(graph, stream.get());
            }
            replay_graph(exec, stream.get(), 1);
          }
          const device::ErrorWord failure = user.fatal();
          ASSERT_EQ(failure.code, 0u) << "rank " << rank << ", " << bytes << " bytes: " << describe(failure);
          std::vector<unsigned char> output(world * kMaxBytes);
          cuda_check(cudaMemcpy(output.data(), gathered.get(), output.size(), cudaMemcpyDeviceToHost), "output");
          for (int sender = 0; sender < world; ++sender) {
            const std::vector<unsigned char> expected = slice_bytes(key, sender, bytes);
            const unsigned char* got = output.data() + sender * bytes;
            ASSERT_EQ(std::memcmp(got, expected.data(), bytes), 0)
                << "rank " << rank << ": slice of rank " << sender << ", " << bytes << " bytes, "
                << (replay ? "replay" : "eager round") << " " << use;
          }
          for (size_t i = world * bytes; i < output.size(); ++i) {
            ASSERT_EQ(output[i], kPoison) << "rank " << rank << ", " << bytes << " bytes: byte " << i << " written";
          }
        }
        cuda_check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
        cuda_check(cudaGraphDestroy(graph), "cudaGraphDestroy");
      }
      device_synchronize();
    }
    comm.barrier();  // no rank frees its slots while a peer's copies may still reach them
  });
}

// Tokens go around the ring with signal and wait alone, on eight channels from kBarrierChannels at once (a block
// each), 256 rounds a launch: eagerly, then in a graph replayed with a new key each time, so a token left from an
// earlier launch is caught. Every token read is the one the previous rank wrote for that round.
TEST(UserSignalPad, SignalAndWaitPassTokensAroundTheRingOnSeveralChannels) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    constexpr int kBlocks = 8, kRounds = 256;
    const int world = comm.size(), rank = comm.rank();
    {
      UserPad user(comm, device::kBarrierChannels + kBlocks, timeout_ns_of(comm), /*with_stopped=*/true);
      SymmetricMemory mailboxes = comm.alloc(static_cast<size_t>(world) * kBlocks * kRounds * sizeof(uint64_t));
      DeviceBuffer key(sizeof(uint64_t)), counts(2 * sizeof(unsigned long long));
      auto* const wrong = static_cast<unsigned long long*>(counts.get());
      const StreamHandle stream;
      const uint64_t seed = shared_seed(comm);
      const auto enqueue = [&] {
        cuda_check(launch_ring_tokens(user.pad(), reinterpret_cast<uint64_t* const*>(mailboxes.device_peers()),
                                      device::kBarrierChannels, kBlocks, kRounds,
                                      static_cast<const uint64_t*>(key.get()), wrong, wrong + 1, stream.get()),
                   "launch ring_tokens");
      };
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      for (int launch = 0; launch < 6; ++launch) {
        const uint64_t launch_key = mix64(seed + static_cast<uint64_t>(launch));
        cuda_check(cudaMemcpy(key.get(), &launch_key, sizeof(launch_key), cudaMemcpyHostToDevice), "key");
        cuda_check(cudaMemset(counts.get(), 0, counts.bytes()), "counts");
        if (launch < 3) {
          enqueue();
          cuda_check(cudaStreamSynchronize(stream.get()), "ring_tokens");
        } else {
          if (exec == nullptr) {
            cuda_check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "begin capture");
            enqueue();
            cuda_check(cudaStreamEndCapture(stream.get(), &graph), "end capture");
            exec = instantiate_on_every_rank(graph, stream.get());
          }
          replay_graph(exec, stream.get(), 1);
        }
        unsigned long long seen[2] = {1, 1};
        cuda_check(cudaMemcpy(seen, counts.get(), sizeof(seen), cudaMemcpyDeviceToHost), "counts");
        const device::ErrorWord failure = user.fatal();
        ASSERT_EQ(failure.code, 0u) << "rank " << rank << ", launch " << launch << ": " << describe(failure);
        EXPECT_EQ(seen[1], 0u) << "rank " << rank << ", launch " << launch << ": failed waits";
        EXPECT_EQ(seen[0], 0u) << "rank " << rank << ", launch " << launch << ": tokens not the previous rank's";
        EXPECT_EQ(user.stopped(), 0u) << "rank " << rank;
        // Every rank has checked this launch before any starts the next.
        comm.barrier();
      }
      cuda_check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
      cuda_check(cudaGraphDestroy(graph), "cudaGraphDestroy");
      device_synchronize();
    }
    comm.barrier();
  });
}

// Rank 0 waits, with a short timeout of its own pad, for a signal rank 1 never sends: the wait gives up and the fatal
// word holds the timeout with rank 0's tags, and rank 0 is stopped. Then every rank meets at a barrier with a plan:
// rank 0 answers at once with kStoppedPlan and fails without waiting; every other rank fails with kErrorPlanMismatch
// naming rank 0 and that answer.
TEST(UserSignalPad, AWaitTimesOutAndTheStoppedRankAnswersTheNextBarrier) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    constexpr unsigned long long kShortTimeoutNs = 50'000'000;
    constexpr int kDataChannel = device::kBarrierChannels;
    constexpr uint64_t kPlan = 7;
    const int rank = comm.rank();
    // value: the signal count the wait saw (rank 1 never signals), limit: the one it needed (its first).
    const Record timeout{device::kErrorTimeout, 1234, 5, 0, 1, kDataChannel, 0, 1};
    {
      UserPad user(comm, device::kBarrierChannels + 1, rank == 0 ? kShortTimeoutNs : timeout_ns_of(comm),
                   /*with_stopped=*/true);
      DeviceBuffer passed(sizeof(int));
      const StreamHandle stream;
      if (rank == 0) {
        const auto start = std::chrono::steady_clock::now();
        cuda_check(launch_wait_once(user.pad(), kDataChannel, /*peer=*/1, /*collective=*/1234, /*site=*/5,
                                    /*plan=*/0, 0, static_cast<int*>(passed.get()), stream.get()),
                   "launch wait_once");
        cuda_check(cudaStreamSynchronize(stream.get()), "wait_once");
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_EQ(read_flag(passed), 0) << "a wait with no signal passed";
        EXPECT_LT(seconds, 10.0) << "the wait's bound is the pad's 50 ms";
        const device::ErrorWord word = user.fatal();
        expect_record(word, timeout, "the wait's timeout");
        EXPECT_GE(word.waited_ns, kShortTimeoutNs) << describe(word);
        EXPECT_NE(user.stopped(), 0u) << "a wait that gave up did not mark its rank stopped";
      }
      comm.barrier();  // rank 0 has stopped before anyone reaches the barrier below
      cuda_check(launch_barrier(user.pad(), /*channel=*/0, /*collective=*/4321, /*site=*/9, kPlan,
                                static_cast<int*>(passed.get()), stream.get()),
                 "launch barrier");
      cuda_check(cudaStreamSynchronize(stream.get()), "barrier");
      EXPECT_EQ(read_flag(passed), 0) << "rank " << rank << ": a barrier with a stopped rank passed";
      const device::ErrorWord word = user.fatal();
      if (rank == 0) {
        expect_record(word, timeout, "the first failure stays recorded");
      } else {
        expect_record(word, {device::kErrorPlanMismatch, 4321, 9, rank, 0, 0, static_cast<long long>(kPlan),
                             static_cast<long long>(device::kStoppedPlan)},
                      "rank " + std::to_string(rank) + ", the stopped rank's answer");
        EXPECT_NE(user.stopped(), 0u) << "rank " << rank << ": a mismatch did not mark the rank stopped";
      }
      EXPECT_EQ(user.data_error().code, 0u) << "rank " << rank;
      device_synchronize();
    }
    comm.barrier();
  });
}

// A barrier whose plans agree passes; the next, where rank 0 announces another plan than everyone else, fails on
// every rank with kErrorPlanMismatch, the rank's own plan as value and the named peer's as limit.
TEST(UserSignalPad, BarriersWithAnotherPlanFailOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank();
    const auto plan_of = [](int of) -> uint64_t { return of == 0 ? 5 : 6; };
    {
      UserPad user(comm, 2, timeout_ns_of(comm), /*with_stopped=*/true);
      DeviceBuffer passed(sizeof(int));
      const StreamHandle stream;
      cuda_check(launch_barrier(user.pad(), 1, 10, 0, /*plan=*/9, static_cast<int*>(passed.get()), stream.get()),
                 "launch barrier");
      cuda_check(cudaStreamSynchronize(stream.get()), "barrier");
      EXPECT_EQ(read_flag(passed), 1) << "rank " << rank << ": a barrier whose plans agree failed";
      ASSERT_EQ(user.fatal().code, 0u) << "rank " << rank << ": " << describe(user.fatal());

      cuda_check(launch_barrier(user.pad(), 1, 11, 3, plan_of(rank), static_cast<int*>(passed.get()), stream.get()),
                 "launch barrier");
      cuda_check(cudaStreamSynchronize(stream.get()), "barrier");
      EXPECT_EQ(read_flag(passed), 0) << "rank " << rank << ": a barrier whose plans differ passed";
      const device::ErrorWord word = user.fatal();
      ASSERT_TRUE(word.peer >= 0 && word.peer < comm.size() && word.peer != rank) << describe(word);
      expect_record(word, {device::kErrorPlanMismatch, 11, 3, rank, word.peer, 1,
                           static_cast<long long>(plan_of(rank)), static_cast<long long>(plan_of(word.peer))},
                    "rank " + std::to_string(rank));
      EXPECT_NE(plan_of(word.peer), plan_of(rank)) << "named a peer of the same plan: " << describe(word);
      EXPECT_NE(user.stopped(), 0u) << "rank " << rank;
      device_synchronize();
    }
    comm.barrier();
  });
}

// Rank 0 waits for data on a channel from kBarrierChannels with a PlanCheck of plan 5, while every other rank has
// gone on to a barrier of plan 6 on the check's channel: rank 0 finds the other plan announced past the grace
// period and records kErrorPlanMismatch (its wait's tags, the check's channel); its answer fails the others'
// barrier with kErrorPlanMismatch naming rank 0 and kStoppedPlan, long before any timeout.
TEST(UserSignalPad, AWaitWithAPlanCheckFailsWhenAPeerIsAtAnotherCallsBarrier) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    constexpr int kDataChannel = device::kBarrierChannels, kBarrierChannel = 0;
    const int rank = comm.rank();
    {
      UserPad user(comm, device::kBarrierChannels + 1, timeout_ns_of(comm), /*with_stopped=*/true);
      DeviceBuffer passed(sizeof(int));
      const StreamHandle stream;
      const auto start = std::chrono::steady_clock::now();
      if (rank == 0) {
        cuda_check(launch_wait_once(user.pad(), kDataChannel, /*peer=*/1, /*collective=*/300, /*site=*/2,
                                    /*plan=*/5, kBarrierChannel, static_cast<int*>(passed.get()),
                                    stream.get()),
                   "launch wait_once");
      } else {
        cuda_check(launch_barrier(user.pad(), kBarrierChannel, /*collective=*/301, /*site=*/4, /*plan=*/6,
                                  static_cast<int*>(passed.get()), stream.get()),
                   "launch barrier");
      }
      cuda_check(cudaStreamSynchronize(stream.get()), "wait or barrier");
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(read_flag(passed), 0) << "rank " << rank << " passed";
      EXPECT_LT(seconds, 0.5 * comm.timeout_s()) << "rank " << rank << " waited for the timeout";
      const device::ErrorWord word = user.fatal();
      if (rank == 0) {
        expect_record(word, {device::kErrorPlanMismatch, 300, 2, 0, 1, kBarrierChannel, 5, 6}, "rank 0's wait");
      } else {
        expect_record(word, {device::kErrorPlanMismatch, 301, 4, rank, 0, kBarrierChannel, 6,
                             static_cast<long long>(device::kStoppedPlan)},
                      "rank " + std::to_string(rank) + "'s barrier");
      }
      EXPECT_NE(user.stopped(), 0u) << "rank " << rank;
      device_synchronize();
    }
    comm.barrier();
  });
}

// A refused-data record is published once: a second record before the host takes the first is dropped, the host's
// clearing frees the word, and the next record lands. The fatal word and the stopped flag stay untouched.
TEST(UserSignalPad, DataErrorsAreRecordedOnceUntilTheHostTakesThem) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), peer = (rank + 1) % comm.size();
    {
      UserPad user(comm, 1, timeout_ns_of(comm), /*with_stopped=*/true);
      const StreamHandle stream;
      cuda_check(launch_record_data_error(user.pad(), device::kErrorBadExpert, 77, peer, 300, 256, stream.get()),
                 "launch record_data_error");
      cuda_check(launch_record_data_error(user.pad(), device::kErrorTooManyTokens, 78, rank, 9, 8, stream.get()),
                 "launch record_data_error");
      cuda_check(cudaStreamSynchronize(stream.get()), "record_data_error");
      const device::ErrorWord first = user.take_data_error();
      expect_record(first, {device::kErrorBadExpert, 77, 0, rank, peer, 0, 300, 256}, "the first record stays");
      EXPECT_EQ(first.waited_ns, 0u) << describe(first);
      EXPECT_EQ(user.data_error().code, 0u) << "taken, yet still published";

      cuda_check(launch_record_data_error(user.pad(), device::kErrorTooManyTokens, 78, rank, 9, 8, stream.get()),
                 "launch record_data_error");
      cuda_check(cudaStreamSynchronize(stream.get()), "record_data_error");
      const device::ErrorWord second = user.take_data_error();
      expect_record(second, {device::kErrorTooManyTokens, 78, 0, rank, rank, 0, 9, 8}, "a record after the clearing");
      EXPECT_EQ(user.fatal().code, 0u) << describe(user.fatal());
      EXPECT_EQ(user.stopped(), 0u) << "a data error stopped the rank";
      device_synchronize();
    }
    comm.barrier();
  });
}

}  // namespace
}  // namespace braid::testing

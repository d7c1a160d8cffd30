// Collectives under stress, on every rank (threads or braid-run processes):
//   - 10000 mixed collectives back to back (every collective, datatype, valid op, root, in/out of place,
//     aligned or not; mostly up to 256 KiB, some 4 MiB, some empty), the same sequence on every rank, enqueued
//     in batches of up to 32 without host synchronisation in between, with random per-rank delays between the
//     calls: host sleeps (0-200 us) and device spin kernels (0-20 us) on the stream. Every call's output is
//     checked against the host reference, and every byte it must not write against what was there.
//   - random cases on every buffer kind and two streams: a shorter mixed sequence with larger calls (up to 8 MiB a
//     rank), each batch on cudaMalloc'd, registered or symmetric arenas in turn, each call on one of two streams
//     of the rank's own choosing, with the same delays; checked as above. Where ranks share GPUs it runs fewer
//     calls, so that a world of 8 on 2 GPUs has an entry of its own within 4 minutes.
//   - large all-reduces in place (the copy engines' on 2 ranks) among small calls of every kind on symmetric
//     buffers, on two streams with the same delays; checked as above.
//   - a rank that skips an all_reduce: the others get braid::Error kTimeout naming it, within the
//     communicator's timeout (2 s) and a margin, and nobody hangs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "spin_kernel.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr size_t kCalls = 10000;
constexpr size_t kMaxBatch = 32;                      // calls enqueued between two host synchronisations
constexpr size_t kArenaBytes = size_t(160) << 20;     // per arena; a batch also ends when the next call won't fit
constexpr size_t kMaxReportedCalls = 10;              // detailed failure lines per rank
constexpr uint32_t kMaxHostSleepUs = 200;
constexpr uint32_t kMaxDeviceSpinNs = 20000;

// A small deterministic random source: the i-th value of stream `key`.
uint64_t random_value(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull); }

// Element count of a stress call: 2% empty, 1% 4 MiB (+1 element), the rest 1 B .. 256 KiB, log-uniform.
size_t stress_count(DataType type, uint64_t r1, uint64_t r2) {
  const size_t element = datatype_size(type);
  const uint64_t size_class = r1 % 100;
  if (size_class < 2) return 0;
  if (size_class < 3) return (size_t(4) << 20) / element + 1;
  const unsigned octave = static_cast<unsigned>(r2 % 18);  // bytes in [2^octave, 2^(octave+1)), below 256 KiB
  const size_t bytes = (size_t(1) << octave) + (r2 >> 8) % (size_t(1) << octave);
  return std::max<size_t>(1, bytes / element);
}

// This rank's delay before call `call` (its own random stream): 1/4 host sleep, 1/4 device spin, 1/2 none.
void delay_before(uint64_t delay_key, size_t call, cudaStream_t stream) {
  const uint64_t r = random_value(delay_key, call);
  switch (r % 4) {
    case 0: std::this_thread::sleep_for(std::chrono::microseconds((r >> 8) % (kMaxHostSleepUs + 1))); break;
    case 1: cuda_check(spin_on_stream(stream, static_cast<uint32_t>((r >> 8) % (kMaxDeviceSpinNs + 1))), "spin kernel launch"); break;
    default: break;
  }
}

// The arenas of one buffer kind.
struct KindArenas {
  const char* name;
  Arenas arenas;
};

// How a sequence of calls runs: the arenas of each batch, the stream of each call, the streams to synchronise.
struct BatchPlan {
  std::function<const KindArenas&(size_t batch)> arenas_of;
  std::function<cudaStream_t(size_t call)> stream_of;
  std::vector<cudaStream_t> streams;  // the first also uploads and downloads
  uint64_t delay_key = 0;             // this rank's delays (delay_before)
};

// Two streams of this rank's own: each call on one of them, and its delays, drawn from `key`.
struct TwoStreams {
  StreamHandle first, second;
  BatchPlan plan;
  TwoStreams(uint64_t key, std::function<const KindArenas&(size_t batch)> arenas_of) {
    plan.arenas_of = std::move(arenas_of);
    plan.streams = {first.get(), second.get()};
    plan.stream_of = [this, key](size_t call) { return plan.streams[random_value(key, call) % 2]; };
    plan.delay_key = key ^ 0xD7ull;
  }
  TwoStreams(const TwoStreams&) = delete;  // plan.stream_of refers to this
  TwoStreams& operator=(const TwoStreams&) = delete;
};

// Runs `calls` (the same on every rank) in batches of up to kMaxBatch that fit the arenas, each enqueued without a
// host synchronisation in between, then checks every call's output against the host reference and every byte it
// must not write. Reports failures; returns the batches run, or 0 where a call threw (the communicator's state is
// then unknown).
size_t run_in_batches(Communicator& comm, const std::vector<Case>& calls, uint64_t seed, const BatchPlan& plan,
                      size_t& failed) {
  const int rank = comm.rank(), world = comm.size();
  std::vector<unsigned char> initial_send, initial_recv, got_send, got_recv;
  size_t next = 0, batches = 0;
  while (next < calls.size()) {
    const KindArenas& kind = plan.arenas_of(batches);  // the same on every rank: a call's buffer kind must agree
    const Arenas& arenas = kind.arenas;
    Batch batch(rank, world);  // the same on every rank (it depends on the sequence and world size only)
    while (next < calls.size() && batch.size() < kMaxBatch &&
           batch.add(calls[next], arenas.send_capacity, arenas.recv_capacity)) {
      ++next;
    }
    if (batch.size() == 0) throw std::logic_error("a call does not fit the arenas: " + describe(calls[next]));
    const size_t first = next - batch.size();
    ++batches;
    batch.initial_images(initial_send, initial_recv);
    upload(arenas, initial_send, initial_recv, plan.streams.front());
    try {
      for (size_t i = 0; i < batch.size(); ++i) {
        const cudaStream_t stream = plan.stream_of(first + i);
        delay_before(plan.delay_key, first + i, stream);
        launch(comm, batch.at(i), batch.send_pointer(i, arenas.send, arenas.recv),
               batch.recv_pointer(i, arenas.send, arenas.recv), stream);
      }
      for (const cudaStream_t stream : plan.streams) cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      comm.check();
    } catch (const Error& error) {
      ADD_FAILURE() << "rank " << rank << ": calls " << first << ".." << next - 1 << " on " << kind.name
                    << " buffers (seed 0x" << std::hex << seed << std::dec << ") threw: " << error.what();
      return 0;
    }
    got_send.resize(initial_send.size());
    got_recv.resize(initial_recv.size());
    download(arenas, got_send, got_recv, plan.streams.front());
    size_t batch_failed = 0;
    const size_t lines_left = failed < kMaxReportedCalls ? kMaxReportedCalls - failed : 0;
    for (const std::string& line : batch.check(initial_send, initial_recv, got_send.data(), got_recv.data(), lines_left,
                                               &batch_failed)) {
      ADD_FAILURE() << line << " [" << kind.name << " buffers; case i of this batch is call " << first << " + i]";
    }
    failed += batch_failed;
  }
  return batches;
}

TEST(CollectivesStress, BackToBackMixedWithRandomDelays) {
  with_communicator([](Communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    const uint64_t seed = shared_seed(comm);
    const std::vector<Case> calls = random_cases(seed, world, kCalls, stress_count);  // the same on every rank
    DeviceBuffer send(kArenaBytes), recv(kArenaBytes);
    const KindArenas arenas{"cudaMalloc", Arenas{send.get(), recv.get(), kArenaBytes, kArenaBytes}};
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    BatchPlan plan;
    plan.arenas_of = [&](size_t) -> const KindArenas& { return arenas; };
    plan.stream_of = [&](size_t) { return stream; };
    plan.streams = {stream};
    plan.delay_key = mix64(seed ^ mix64(0xDE1A7ull + static_cast<uint64_t>(rank)));
    size_t failed = 0;
    const auto start = std::chrono::steady_clock::now();
    const size_t batches = run_in_batches(comm, calls, seed, plan, failed);
    if (batches == 0) return;  // a call threw: reported
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(failed, 0u) << "rank " << rank << ": " << failed << " of " << calls.size() << " calls failed (seed 0x"
                          << std::hex << seed << std::dec << ")";
    if (rank == 0) {
      std::printf("[stress] %zu calls in %zu batches on %d rank(s): %.2f s\n", calls.size(), batches, world, seconds);
    }
  });
}

// Element count of a random case: 2% empty, 8% from 256 KiB to 8 MiB (log-uniform, an odd element count), the rest
// as a stress call's small sizes.
size_t random_case_count(DataType type, uint64_t r1, uint64_t r2) {
  const size_t element = datatype_size(type);
  const uint64_t size_class = r1 % 100;
  if (size_class < 2) return 0;
  if (size_class < 10) {
    const unsigned octave = 18 + static_cast<unsigned>(r2 % 5);  // [256 KiB, 8 MiB)
    const size_t bytes = (size_t(1) << octave) + (r2 >> 8) % (size_t(1) << octave);
    return std::max<size_t>(1, bytes / element) | 1;
  }
  return stress_count(type, r1 / 100, r2);
}

TEST(CollectivesStress, RandomCasesOnEveryBufferKindAndTwoStreams) {
  with_communicator([](Communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    const uint64_t seed = shared_seed(comm);
    const size_t call_count = ranks_share_gpus() ? 1000 : 4000;
    const std::vector<Case> calls = random_cases(seed ^ 0x7A4D0Bull, world, call_count, random_case_count);
    const uint64_t key = mix64(seed ^ mix64(0x57E4A5ull + static_cast<uint64_t>(rank)));  // this rank's own draws
    DeviceBuffer plain_send(kArenaBytes), plain_recv(kArenaBytes), registered_send(kArenaBytes),
        registered_recv(kArenaBytes);
    RegisteredBuffer send_registration = comm.register_buffer(registered_send.get(), kArenaBytes);
    RegisteredBuffer recv_registration = comm.register_buffer(registered_recv.get(), kArenaBytes);
    SymmetricMemory symmetric_send = comm.alloc(kArenaBytes), symmetric_recv = comm.alloc(kArenaBytes);
    const KindArenas kinds[] = {
        {"cudaMalloc", Arenas{plain_send.get(), plain_recv.get(), kArenaBytes, kArenaBytes}},
        {"registered", Arenas{registered_send.get(), registered_recv.get(), kArenaBytes, kArenaBytes}},
        {"symmetric", Arenas{symmetric_send.local(), symmetric_recv.local(), kArenaBytes, kArenaBytes}},
    };
    TwoStreams two(key, [&](size_t batch) -> const KindArenas& { return kinds[batch % 3]; });
    size_t failed = 0;
    if (run_in_batches(comm, calls, seed, two.plan, failed) == 0) return;  // a call threw: reported
    EXPECT_EQ(failed, 0u) << "rank " << rank << ": " << failed << " of " << calls.size() << " calls failed (seed 0x"
                          << std::hex << seed << std::dec << ")";
    comm.barrier();  // no rank releases its buffers while a peer's call may still reach them
    comm.deregister(send_registration);
    comm.deregister(recv_registration);
  });
}

// Large all-reduces in place among small calls of every kind, on symmetric buffers, two streams and the same
// delays: on 2 ranks the large ones take the copy engines, whose first pushes land in the peer's pipeline area,
// which the small calls' FIFOs (reduce, broadcast, all-to-all in place, ...) use before and after them. Every
// fourth call is an all-reduce in place of 65-100 MiB (an odd count; sum, avg or max; float32 or bfloat16).
TEST(CollectivesStress, LargeAllReducesInPlaceAmongSmallCallsOnTwoStreams) {
  with_communicator([](Communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    const uint64_t seed = shared_seed(comm);
    std::vector<Case> calls = random_cases(seed ^ 0x1A46Eull, world, ranks_share_gpus() ? 24 : 48, stress_count);
    for (size_t i = 0; i < calls.size(); i += 4) {
      const uint64_t r = mix64(seed ^ (0x1A46E0ull + i));
      Case& c = calls[i];
      c.collective = Collective::kAllReduce;
      c.type = r % 2 == 0 ? DataType::kFloat32 : DataType::kBFloat16;
      constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
      c.op = kOps[(r >> 8) % 3];
      c.in_place = true;
      c.aligned = true;
      const size_t bytes = (size_t(65) << 20) + (r >> 16) % (size_t(35) << 20);
      c.count = bytes / datatype_size(c.type) | 1;
    }
    const uint64_t key = mix64(seed ^ mix64(0x1A46E5ull + static_cast<uint64_t>(rank)));  // this rank's own draws
    SymmetricMemory send = comm.alloc(kArenaBytes), recv = comm.alloc(kArenaBytes);
    const KindArenas symmetric{"symmetric", Arenas{send.local(), recv.local(), kArenaBytes, kArenaBytes}};
    TwoStreams two(key, [&](size_t) -> const KindArenas& { return symmetric; });
    size_t failed = 0;
    if (run_in_batches(comm, calls, seed, two.plan, failed) == 0) return;  // a call threw: reported
    EXPECT_EQ(failed, 0u) << "rank " << rank << ": " << failed << " of " << calls.size() << " calls failed (seed 0x"
                          << std::hex << seed << std::dec << ")";
    comm.barrier();  // no rank frees its symmetric buffers while a peer's call may still reach them
  });
}

// A rank that never makes a call: the others' kernels give up after the communicator's timeout and record
// which collective, which wait and which peer; the host raises it as kTimeout. A communicator is unusable
// after a timeout: one is made per algorithm and destroyed, and only the keeper communicator's host barrier
// lines the ranks up between them.
// A timed-out wait tells how far the late rank got (device::WaitProgress): the LL poll, the LL call it is in
// and an older one's flag on the line (or none); a barrier, the signal count it needed and the smaller one it saw.
// LL128's per-warp polls tell nothing.
void expect_progress_told(const std::string& algorithm, int rank, const std::string& message) {
  std::smatch found;
  if (algorithm == "allreduce=ll") {
    const std::regex told("(never been written|held LL call ([0-9]+)'s flag); this call is the communicator's LL "
                          "call ([0-9]+)\\.");
    ASSERT_TRUE(std::regex_search(message, found, told)) << "rank " << rank << ": no LL progress: " << message;
    if (found[2].matched) {
      EXPECT_LT(std::stoull(found[2].str()), std::stoull(found[3].str())) << "rank " << rank << ": " << message;
    }
  } else if (algorithm != "allreduce=ll128") {
    const std::regex told("signal count on that channel was (-?[0-9]+); the wait needed (-?[0-9]+)\\.");
    ASSERT_TRUE(std::regex_search(message, found, told)) << "rank " << rank << ": no signal count: " << message;
    EXPECT_LT(std::stoll(found[1].str()), std::stoll(found[2].str())) << "rank " << rank << ": " << message;
  }
}

TEST(CollectivesStress, TimeoutNamesTheMissingRankAndCollective) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank([](const RankContext& context) {
    // Line the ranks up first, on a communicator with the usual timeout, so that the 2 s one is not at risk
    // while it is being made (ranks may reach this test seconds apart as processes).
    Communicator keeper = Communicator::init(context.rendezvous, test_options());
    make_current(keeper);
    // Buffers and stream made once, before any rank's call: where ranks share a GPU as threads, an allocation, a
    // synchronous memset or a new stream waits behind a peer's call in flight (docs/shared-gpu.md).
    constexpr size_t n = 1 << 18;  // float32 elements
    DeviceBuffer send(n * 4), recv(n * 4);
    cuda_check(cudaMemset(send.get(), 0, n * 4), "cudaMemset");
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    // Every all-reduce algorithm waits in its own way (barriers, FIFO pieces, LL lines): each must give up.
    for (const char* algorithm : {"allreduce=ll", "allreduce=ll128", "allreduce=oneshot", "allreduce=twoshot"}) {
      keeper.barrier();  // the skipping rank is back in step: it skipped the previous call and came here
      constexpr double kTimeoutS = 2.0;
      constexpr double kMarginS = 8.0;
      CommOptions options = test_options(kTimeoutS);
      options.algorithms = algorithm;
      Communicator comm = Communicator::init(context.rendezvous, options);
      const int rank = comm.rank(), world = comm.size();
      const int skipper = world - 1;
      // No rank's first call spins before every rank's init (its allocations and streams) is over: a rank held
      // there past the 2 s would time its peers' first call out (NOTE [shared-GPU waits]).
      host_barrier();
      auto all_reduce = [&] { comm.all_reduce(send.get(), recv.get(), n, DataType::kFloat32, ReduceOp::kSum, stream); };

      // Everyone makes the first call: the communicator works.
      all_reduce();
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (first all_reduce)");
      comm.check();

      if (rank == skipper) continue;  // skips the second call

      const auto start = std::chrono::steady_clock::now();
      std::optional<Error> error;
      try {
        all_reduce();
        // The kernel gives up after the timeout, so this returns.
        cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (the all_reduce rank " + std::to_string(skipper) +
                                                      " skipped)");
        comm.check();
        // Not raised by check(): the next call must raise it.
        all_reduce();
        cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (the call after)");
        comm.check();
      } catch (const Error& caught) {
        error = caught;
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ASSERT_TRUE(error.has_value()) << "rank " << rank << ": no error " << seconds << " s after rank " << skipper
                                     << " skipped an all_reduce (" << algorithm << ")";
      const std::string message = error->what();
      EXPECT_EQ(error->code(), ErrorCode::kTimeout) << "rank " << rank << " (" << algorithm << "): " << message;
      const std::regex names_skipper("\\b(rank|peer) " + std::to_string(skipper) + "\\b", std::regex::icase);
      EXPECT_TRUE(std::regex_search(message, names_skipper))
          << "rank " << rank << ": the message does not name rank " << skipper << ": " << message;
      const std::regex names_collective("all_?reduce", std::regex::icase);
      EXPECT_TRUE(std::regex_search(message, names_collective))
          << "rank " << rank << ": the message does not name the all_reduce: " << message;
      EXPECT_GE(seconds, 0.5 * kTimeoutS) << "rank " << rank << ": gave up before the timeout: " << message;
      EXPECT_LE(seconds, kTimeoutS + kMarginS) << "rank " << rank << ": took " << seconds << " s to report: " << message;
      expect_progress_told(algorithm, rank, message);
      if (rank == 0) std::printf("[timeout] %s, rank 0: %s\n", algorithm, message.c_str());
      // comm is unusable now; it is destroyed here without any further collective call.
    }
  });
}

}  // namespace
}  // namespace braid::testing

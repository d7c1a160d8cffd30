// Failures a job must survive without a hang: abort() from another thread ends a call that waits on a peer,
// revoke() on one rank ends every rank's (their host waits too), survivors shrink and carry on, a peer process that
// exits or is SIGKILLed during any kind of call (every protocol family, MoE dispatch and combine, a graph replay) or a
// host wait is reported to the survivor within a second (a peer that destroyed its communicator first is no
// failure), and a peer that is alive but never calls ends in a timeout; a thousand cycles of init, collectives and
// abort leave no fd, thread or GPU memory behind. The peer process is this binary run again (GPU_TEST_FAULT_CHILD,
// FaultChild.*), sharing the survivor's GPU where only one is visible (BRAID_ALLOW_SHARED_GPU=1).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "process_resources.hpp"
#include "test_helpers.hpp"
#include "world.hpp"

extern char** environ;

namespace braid::testing {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// An all-reduce of ones from `send` into `recv` (count floats each); true when every element is the world size.
bool all_reduce_ones(Communicator& comm, cudaStream_t stream, size_t count, void* send, void* recv) {
  const std::vector<float> ones(count, 1.0f);
  cuda_check(cudaMemcpy(send, ones.data(), count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  comm.all_reduce(send, recv, count, DataType::kFloat32, ReduceOp::kSum, stream);
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<float> got(count);
  cuda_check(cudaMemcpy(got.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (float value : got) {
    if (value != static_cast<float>(comm.size())) return false;
  }
  return true;
}

// The same on buffers of its own.
bool all_reduce_ones(Communicator& comm, cudaStream_t stream, size_t count) {
  DeviceBuffer send(count * sizeof(float)), recv(count * sizeof(float));
  return all_reduce_ones(comm, stream, count, send.get(), recv.get());
}

// Rank 0 calls an all-reduce that rank 1 never joins; a watchdog thread aborts rank 0 after 200 ms. The waiting
// kernel must end within 100 ms of the abort, and every later call must raise kAborted.
TEST(Faults, AbortFromAnotherThreadEndsAWaitingCallWithin100ms) {
  if (in_process_mode()) GTEST_SKIP() << "ranks as threads only: rank 1 waits on rank 0's thread";
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::atomic<bool> rank0_done{false};
  for_each_rank([&](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, test_options(30));
    make_current(comm);
    if (context.rank != 0) {
      while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;  // never joined the call; destroys its communicator
    }
    StreamHandle stream;
    DeviceBuffer send(4096 * sizeof(float)), recv(4096 * sizeof(float));
    cuda_check(cudaMemset(send.get(), 0, 4096 * sizeof(float)), "cudaMemset");
    comm.all_reduce(send.get(), recv.get(), 4096, DataType::kFloat32, ReduceOp::kSum, stream.get());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady) << "the all-reduce finished without rank 1";
    Clock::time_point aborted_at;
    std::thread watchdog([&] {
      aborted_at = Clock::now();
      comm.abort();
    });
    watchdog.join();
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    const double waited = seconds_since(aborted_at);
    std::printf("[faults] abort to the kernel's end: %.1f ms\n", waited * 1e3);
    EXPECT_LT(waited, 0.1) << "the waiting kernel outlived the abort";
    try {
      comm.check();
      ADD_FAILURE() << "check() after abort() raised nothing";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kAborted) << error.what();
    }
    try {
      comm.all_reduce(send.get(), recv.get(), 4096, DataType::kFloat32, ReduceOp::kSum, stream.get());
      ADD_FAILURE() << "a call after abort() was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kAborted) << error.what();
    }
    comm.abort();  // idempotent
    rank0_done = true;
  });
}

// Rank 1 waits in an all-reduce that no other rank joins; rank 0 revokes. Rank 1's kernel ends within 100 ms
// (the watch looks every 10 ms) and every rank's calls raise kRevoked naming rank 0.
TEST(Faults, RevokeByOneRankEndsAPeersWaitingCallWithin100ms) {
  if (in_process_mode()) GTEST_SKIP() << "ranks as threads only: rank 0 waits on rank 1's thread";
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::atomic<bool> waiting{false};
  std::atomic<Clock::rep> revoked_at{0};
  for_each_rank([&](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, test_options(30));
    make_current(comm);
    StreamHandle stream;
    DeviceBuffer send(4096 * sizeof(float)), recv(4096 * sizeof(float));
    cuda_check(cudaMemset(send.get(), 0, 4096 * sizeof(float)), "cudaMemset");
    comm.barrier();  // both done with the allocations above before any kernel waits
    if (context.rank == 1) {
      comm.all_reduce(send.get(), recv.get(), 4096, DataType::kFloat32, ReduceOp::kSum, stream.get());
      waiting = true;
      cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
      const double waited = std::chrono::duration<double>(Clock::now().time_since_epoch() -
                                                           Clock::duration(revoked_at.load())).count();
      std::printf("[faults] rank 0's revoke to rank 1's kernel's end: %.1f ms\n", waited * 1e3);
      EXPECT_LT(waited, 0.1) << "rank 1's waiting kernel outlived the revocation";
    } else if (context.rank == 0) {
      while (!waiting.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 1's kernel waits by now
      revoked_at = Clock::now().time_since_epoch().count();
      comm.revoke();
    } else {  // the other ranks see it at their watch's next look
      while (revoked_at.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (int attempt = 0; attempt < 2; ++attempt) {  // check(), then a call
      try {
        if (attempt == 0) comm.check();
        else comm.all_reduce(send.get(), recv.get(), 4096, DataType::kFloat32, ReduceOp::kSum, stream.get());
        ADD_FAILURE() << "rank " << context.rank << ": nothing raised after the revocation";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), ErrorCode::kRevoked) << error.what();
        EXPECT_NE(std::string(error.what()).find("rank 0 revoked"), std::string::npos) << error.what();
      }
    }
  });
}

// Ranks leave (the last one; at 4 ranks ranks 1 and 3, so 4 -> 2); the others revoke and shrink, then all-reduce on
// the child: the survivors keep their order, the sum is theirs alone, and the parent's symmetric memory is still
// mapped.
TEST(Faults, SurvivorsShrinkAndCarryOn) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // As processes the leaving rank would learn of the survivors' end only by its 60 s bound, and its next test
  // would start that late: the survivors' next init gives up after 30 s. The threads entries run it.
  if (in_process_mode()) GTEST_SKIP() << "ranks as threads only: the leaving rank waits for the survivors' count";
  const int world = world_size();
  const std::vector<int> gone = world == 4 ? std::vector<int>{1, 3} : std::vector<int>{world - 1};
  const int survivors = world - static_cast<int>(gone.size());
  int32_t survivors_sum = 0;
  for (int r = 0; r < world; ++r) {
    if (std::find(gone.begin(), gone.end(), r) == gone.end()) survivors_sum += r + 1;
  }
  // NOTE [a leaving thread keeps its communicator]: as threads, a rank that leaves keeps its communicator until the
  // survivors are done (bounded). Destroying it frees memory with a wait for its whole GPU, and where ranks share a
  // GPU that wait holds up the survivors' launches there while their peers spin on them.
  std::atomic<int> survivors_done{0};
  for_each_rank([&](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, test_options(30));
    make_current(comm);
    SymmetricMemory parent_memory = comm.alloc(4096);
    comm.barrier();
    if (std::find(gone.begin(), gone.end(), context.rank) != gone.end()) {  // leaves without a word
      const auto left = Clock::now();
      while (survivors_done.load() < survivors && seconds_since(left) < 60.0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      return;
    }
    struct Done {
      std::atomic<int>& count;
      ~Done() { ++count; }
    } done{survivors_done};
    const auto started = Clock::now();
    comm.revoke();
    Communicator child = comm.shrink(gone);
    std::printf("[faults] rank %d: revoke and shrink %d -> %d ranks: %.1f ms\n", context.rank, world, survivors,
                seconds_since(started) * 1e3);
    // The survivors below this rank.
    const int expected_rank =
        context.rank - static_cast<int>(std::count_if(gone.begin(), gone.end(), [&](int r) { return r < context.rank; }));
    EXPECT_EQ(child.size(), survivors);
    EXPECT_EQ(child.rank(), expected_rank);
    make_current(child);
    StreamHandle stream;
    DeviceBuffer values(1024 * sizeof(int32_t));
    std::vector<int32_t> host(1024, context.rank + 1);
    cuda_check(cudaMemcpy(values.get(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
    child.all_reduce(values.get(), values.get(), 1024, DataType::kInt32, ReduceOp::kSum, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    child.check();
    cuda_check(cudaMemcpy(host.data(), values.get(), host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
    EXPECT_EQ(std::count(host.begin(), host.end(), survivors_sum), 1024) << "rank " << context.rank;
    EXPECT_NE(parent_memory.local(), nullptr);
    try {
      comm.check();
      ADD_FAILURE() << "the revoked parent raised nothing";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kRevoked) << error.what();
    }
  });
}

// Runs `call`, which must raise `code` with `text` in its message; returns the seconds it took.
double expect_raises(const std::function<void()>& call, ErrorCode code, const std::string& text, const char* what) {
  const auto started = Clock::now();
  try {
    call();
    ADD_FAILURE() << what << ": nothing raised";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << what << ": " << error.what();
    EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << what << ": " << error.what();
  }
  return seconds_since(started);
}

// Rank 0 revokes while the others wait in barrier() for it (a host wait on the store, which rank 0 never joins):
// their barriers end with kRevoked naming rank 0 within a second, not at the 30 s timeout, and every rank's later
// host waits (barrier, host_allgather) raise it at once, the revoking rank's too. Then every rank shrinks with
// nobody excluded and the child runs.
TEST(Faults, RevokeEndsEveryRanksHostWaitsAndShrinkStillWorks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank([&](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, test_options(30));
    make_current(comm);
    comm.barrier();
    if (context.rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others wait in their barrier by now
      comm.revoke();
    } else {
      const double waited = expect_raises([&] { comm.barrier(); }, ErrorCode::kRevoked, "rank 0 revoked",
                                          "a barrier waiting for the revoking rank");
      std::printf("[faults] rank %d: barrier ended by rank 0's revoke after %.1f ms (from its start)\n", context.rank,
                  waited * 1e3);
      EXPECT_GT(waited, 0.2) << "rank " << context.rank << "'s barrier did not wait for the revocation";
      EXPECT_LT(waited, 5.0) << "rank " << context.rank << "'s barrier outlived the revocation";
    }
    double later = expect_raises([&] { comm.barrier(); }, ErrorCode::kRevoked, "rank 0 revoked", "a later barrier");
    later += expect_raises([&] { comm.host_allgather("x"); }, ErrorCode::kRevoked, "rank 0 revoked",
                           "a later host_allgather");
    EXPECT_LT(later, 1.0) << "rank " << context.rank << ": later host waits did not end at once";
    Communicator child = comm.shrink({});
    make_current(child);
    EXPECT_EQ(child.size(), comm.size());
    EXPECT_EQ(child.rank(), context.rank);
    StreamHandle stream;
    const size_t count = 4096;
    DeviceBuffer send(count * sizeof(float)), recv(count * sizeof(float));
    const std::vector<float> mine(count, static_cast<float>(context.rank + 1));
    cuda_check(cudaMemcpy(send.get(), mine.data(), send.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
    child.barrier();  // every rank done with the allocations above before any kernel waits (ranks may share a GPU)
    child.all_reduce(send.get(), recv.get(), count, DataType::kFloat32, ReduceOp::kSum, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    child.check();
    std::vector<float> got(count);
    cuda_check(cudaMemcpy(got.data(), recv.get(), recv.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    const float sum = static_cast<float>(child.size() * (child.size() + 1) / 2);
    EXPECT_EQ(std::count(got.begin(), got.end(), sum), static_cast<long>(count)) << "rank " << context.rank;
  });
}

// init, collectives, abort, over and over: 1000 cycles as threads, 100 as processes (GPU_TEST_ABORT_CYCLES
// overrides). Every fifth cycle rank 0 aborts while its all-reduce waits for peers that never join it. A second
// communicator, made once, holds the ranks together between cycles (no rank destroys what a peer's kernel may
// still use) and around the readings. After a warm-up, open fds, threads and free GPU memory must not grow.
TEST(FaultCycles, InitCollectivesAbortLeaveNothingBehind) {
  const char* asked = std::getenv("GPU_TEST_ABORT_CYCLES");
  const int cycles = asked != nullptr ? std::atoi(asked) : in_process_mode() ? 100 : 1000;
  const int warm = std::min(19, cycles / 5), middle = cycles / 2;
  struct Reading {
    size_t fds = 0, threads = 0, free_bytes = 0;
  };
  for_each_rank([&](const RankContext& context) {
    Communicator holder = Communicator::init(context.rendezvous, test_options(30));
    make_current(holder);
    StreamHandle stream;
    DeviceBuffer send(4096 * sizeof(float)), recv(4096 * sizeof(float));
    auto read_between_barriers = [&] {
      holder.barrier();
      Reading reading{open_fds(), live_threads(), free_device_bytes()};
      holder.barrier();
      return reading;
    };
    Reading at_warm, at_middle;
    for (int i = 0; i < cycles; ++i) {
      {
        Communicator comm = Communicator::init(context.rendezvous, test_options(30));
        make_current(comm);
        // Freed in step at the cycle's end: a buffer free_when_ranks_end held back would count as a leak.
        LockstepBuffer small_send(1024 * sizeof(float)), small_recv(1024 * sizeof(float));
        LockstepBuffer large_send(sizeof(float) << 20), large_recv(sizeof(float) << 20);
        EXPECT_TRUE(all_reduce_ones(comm, stream.get(), 1024, small_send.get(), small_recv.get()))
            << "rank " << context.rank << ", cycle " << i << ", LL";
        EXPECT_TRUE(all_reduce_ones(comm, stream.get(), size_t(1) << 20, large_send.get(), large_recv.get()))
            << "rank " << context.rank << ", cycle " << i << ", 4 MiB";
        if (i % 5 == 4 && context.rank == 0) {
          comm.all_reduce(send.get(), recv.get(), 4096, DataType::kFloat32, ReduceOp::kSum, stream.get());
        }
        comm.abort();
        cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
        holder.barrier();  // every rank's kernels have ended before any rank's communicator goes
      }
      make_current(holder);
      if (i == warm) at_warm = read_between_barriers();
      if (i == middle) at_middle = read_between_barriers();
    }
    const Reading at_end = read_between_barriers();
    if (context.rank == 0) {
      std::printf("[faults] %d init/collectives/abort cycles: open fds %zu -> %zu -> %zu, threads %zu -> %zu -> %zu, "
                  "free GPU memory %zu -> %zu -> %zu bytes (after cycles %d, %d, %d)\n",
                  cycles, at_warm.fds, at_middle.fds, at_end.fds, at_warm.threads, at_middle.threads, at_end.threads,
                  at_warm.free_bytes, at_middle.free_bytes, at_end.free_bytes, warm, middle, cycles - 1);
    }
    EXPECT_EQ(at_end.fds, at_warm.fds) << "rank " << context.rank << ": open fds grew";
    EXPECT_EQ(at_end.threads, at_warm.threads) << "rank " << context.rank << ": threads grew";
    // The driver may keep a page of bookkeeping; a leak of every cycle's areas would be hundreds of MB.
    EXPECT_LE(at_warm.free_bytes > at_end.free_bytes ? at_warm.free_bytes - at_end.free_bytes : 0, size_t(2) << 20)
        << "rank " << context.rank << ": free GPU memory " << at_warm.free_bytes << " -> " << at_end.free_bytes;
  });
}

// The survivor's side of a job whose rank 1 is this binary run again with GPU_TEST_FAULT_CHILD=`mode`: both
// ranks make a communicator and all-reduce once, then the child leaves as `mode` says. Returns the child's pid
// and the survivor's communicator through `body`.
void with_child_rank(const char* mode, const std::function<void(Communicator&, pid_t)>& body,
                     const std::string& algorithms = "", double timeout_s = 30) {
  int gpus = 0;
  cuda_check(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  const char* shared = std::getenv("BRAID_ALLOW_SHARED_GPU");
  if (gpus < 2 && (shared == nullptr || std::string(shared) != "1")) {
    GTEST_SKIP() << "one GPU and BRAID_ALLOW_SHARED_GPU unset: the child rank has no GPU of its own";
  }
  StoreHost store;
  const std::string job = std::string("faults/") + mode + "/" + std::to_string(getpid());
  std::vector<std::string> settings = {"GPU_TEST_FAULT_CHILD=" + std::string(mode),
                                       "GPU_TEST_FAULT_STORE=" + store.address(), "GPU_TEST_FAULT_JOB=" + job,
                                       "GPU_TEST_FAULT_DEVICE=" + std::to_string(gpus > 1 ? 1 : 0),
                                       "GPU_TEST_FAULT_ALGO=" + algorithms};
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  for (std::string& setting : settings) env.push_back(setting.data());
  env.push_back(nullptr);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=FaultChild.*";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
  Rendezvous rendezvous = Rendezvous::at_store(store.address(), 0, 2, false);
  rendezvous.job_id = job;
  CommOptions options = test_options(timeout_s);
  options.device = 0;
  options.algorithms = algorithms;
  {
    Communicator comm = Communicator::init(rendezvous, options);
    make_current(comm);
    body(comm, child);
  }
  int status = 0;
  waitpid(child, &status, 0);  // reaped already where the body waited for it
}

// Polls check() until the second after `since` is over (the watch publishes from its own thread): true when it
// raised, which must be kRemoteError naming rank 1.
bool remote_error_naming_rank_1(Communicator& comm, Clock::time_point since, const std::string& what) {
  while (seconds_since(since) < 1.0) {
    try {
      comm.check();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kRemoteError) << what << ": " << error.what();
      EXPECT_NE(std::string(error.what()).find("rank 1"), std::string::npos) << what << ": " << error.what();
      return true;
    }
  }
  return false;
}

// Rank 1 exits without destroying its communicator while rank 0 waits on it in an all-reduce: rank 0's kernel
// ends and check() raises kRemoteError naming rank 1, within a second of the exit.
TEST(Faults, PeerProcessThatExitsIsReportedWithinASecond) {
  if (in_process_mode()) GTEST_SKIP() << "spawns its own peer process";
  with_child_rank("exit", [](Communicator& comm, pid_t child) {
    StreamHandle stream;
    EXPECT_TRUE(all_reduce_ones(comm, stream.get(), 1024)) << "the first all-reduce, with the child";
    DeviceBuffer send(1024 * sizeof(float)), recv(1024 * sizeof(float));
    cuda_check(cudaMemset(send.get(), 0, 1024 * sizeof(float)), "cudaMemset");
    comm.all_reduce(send.get(), recv.get(), 1024, DataType::kFloat32, ReduceOp::kSum, stream.get());
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    const Clock::time_point exited_at = Clock::now();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child failed before it exited: " << status;
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    const bool raised = remote_error_naming_rank_1(comm, exited_at, "the peer's exit");
    const double waited = seconds_since(exited_at);
    std::printf("[faults] the peer's exit to kRemoteError: %.1f ms\n", waited * 1e3);
    EXPECT_TRUE(raised) << "no failure reported " << waited << " s after rank 1 exited";
  });
}

// Rank 1 exits without destroying its communicator while rank 0 waits for it in barrier() (a host wait on the
// store): the barrier ends with kRemoteError naming rank 1 soon after the exit (3 s bound), not at the 30 s timeout.
TEST(Faults, PeerProcessThatExitsEndsAHostWait) {
  if (in_process_mode()) GTEST_SKIP() << "spawns its own peer process";
  with_child_rank("exit", [](Communicator& comm, pid_t child) {
    StreamHandle stream;
    EXPECT_TRUE(all_reduce_ones(comm, stream.get(), 1024)) << "the first all-reduce, with the child";
    const double waited = expect_raises([&] { comm.barrier(); }, ErrorCode::kRemoteError, "rank 1",
                                        "a barrier waiting for the exited rank");
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child failed before it exited: " << status;
    std::printf("[faults] barrier ended by the peer's exit after %.1f ms (the child leaves 300 ms in)\n", waited * 1e3);
    EXPECT_GT(waited, 0.1) << "the barrier did not wait for the peer's exit";
    EXPECT_LT(waited, 3.0) << "the barrier outlived the peer's exit";
    expect_raises([&] { comm.host_allgather("x"); }, ErrorCode::kRemoteError, "rank 1", "a later host_allgather");
  });
}

// Rank 1 destroys its communicator, then exits: rank 0's communicator has seen no failure.
TEST(Faults, PeerThatDestroyedItsCommunicatorBeforeExitingIsNoFailure) {
  if (in_process_mode()) GTEST_SKIP() << "spawns its own peer process";
  with_child_rank("destroy", [](Communicator& comm, pid_t child) {
    StreamHandle stream;
    EXPECT_TRUE(all_reduce_ones(comm, stream.get(), 1024)) << "the all-reduce, with the child";
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // longer than the watch takes to see an exit
    EXPECT_NO_THROW(comm.check());
  });
}

// What both ranks of a kill case make after their first all-reduce (each of these is collective): symmetric memory
// for the zero-copy and graph cases, a small MoE buffer and one dispatch through it that both ranks complete, so
// rank 0 can combine it alone.
struct KillRig {
  static constexpr size_t kSymmetricBytes = size_t(4) << 20;
  static MoeShape shape() {
    MoeShape shape;
    shape.hidden = 256;
    shape.type = DataType::kBFloat16;
    shape.max_tokens = 16;
    shape.top_k = 2;
    shape.experts = 4;
    return shape;
  }
  static size_t pairs() { return shape().max_tokens * static_cast<size_t>(shape().top_k); }
  static size_t token_bytes() { return shape().max_tokens * shape().hidden * 2; }

  explicit KillRig(Communicator& comm)
      : symmetric(comm.alloc(kSymmetricBytes)),
        moe(MoeBuffer::create(comm, shape())),
        x(token_bytes()),
        ids(pairs() * sizeof(int64_t)),
        weights(pairs() * sizeof(float)) {
    std::vector<int64_t> routing(pairs());
    for (size_t i = 0; i < routing.size(); ++i) routing[i] = static_cast<int64_t>(i % shape().experts);
    const std::vector<float> ones(pairs(), 1.0f);
    cuda_check(cudaMemcpy(ids.get(), routing.data(), ids.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_check(cudaMemcpy(weights.get(), ones.data(), weights.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_check(cudaMemset(x.get(), 0, x.bytes()), "cudaMemset");
    StreamHandle stream;
    dispatched = moe.dispatch(x.get(), ids.get(), static_cast<const float*>(weights.get()), shape().max_tokens,
                              nullptr, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize after the rig's dispatch");
  }
  SymmetricMemory symmetric;
  MoeBuffer moe;
  DeviceBuffer x, ids, weights;
  MoeDispatchOutput dispatched;  // completed on both ranks
};

// One call rank 0 makes that rank 1 (alive, then SIGKILLed) never joins; what it allocates goes into `keep`,
// which outlives the call's kernels.
using Keep = std::deque<DeviceBuffer>;
struct KillCase {
  const char* name;
  const char* algorithms;  // BRAID_ALGO of both ranks
  std::function<void(Communicator&, KillRig&, Keep&, cudaStream_t)> call;
};

void* plain(Keep& keep, size_t bytes) { return keep.emplace_back(bytes).get(); }

std::vector<KillCase> kill_cases() {
  constexpr size_t kFloats = size_t(1) << 20;  // 4 MiB, past every LL size unless forced
  constexpr size_t kBytes = kFloats * sizeof(float);
  constexpr auto kF32 = DataType::kFloat32;
  auto plain_all_reduce = [](size_t count) {
    return [count](Communicator& comm, KillRig&, Keep& keep, cudaStream_t stream) {
      comm.all_reduce(plain(keep, count * 4), plain(keep, count * 4), count, kF32, ReduceOp::kSum, stream);
    };
  };
  return {
      {"all-reduce, LL", "allreduce=ll", plain_all_reduce(4096)},
      {"all-reduce, staged two-shot (cudaMalloc)", "allreduce=twoshot", plain_all_reduce(kFloats)},
      {"all-reduce, copy engines (symmetric)", "allreduce=copyengine",
       [](Communicator& comm, KillRig& rig, Keep&, cudaStream_t stream) {
         float* base = static_cast<float*>(rig.symmetric.local());
         comm.all_reduce(base, base, kFloats / 2, kF32, ReduceOp::kSum, stream);
       }},
      {"all-reduce, zero copy (symmetric)", "allreduce=twoshot",
       [](Communicator& comm, KillRig& rig, Keep&, cudaStream_t stream) {
         float* base = static_cast<float*>(rig.symmetric.local());
         comm.all_reduce(base, base + kFloats / 2, kFloats / 2, kF32, ReduceOp::kSum, stream);
       }},
      {"all-gather", "",
       [](Communicator& comm, KillRig&, Keep& keep, cudaStream_t stream) {
         comm.all_gather(plain(keep, kBytes), plain(keep, 2 * kBytes), kFloats, kF32, stream);
       }},
      {"all-to-all", "",
       [](Communicator& comm, KillRig&, Keep& keep, cudaStream_t stream) {
         comm.all_to_all(plain(keep, kBytes), plain(keep, kBytes), kFloats / 2, kF32, stream);
       }},
      {"all-to-allv", "",
       [](Communicator& comm, KillRig&, Keep& keep, cudaStream_t stream) {
         const size_t counts[2] = {1000, 300000};
         comm.all_to_allv(plain(keep, kBytes), counts, nullptr, plain(keep, kBytes), counts, nullptr, kF32, stream);
       }},
      {"send/recv", "",
       [](Communicator& comm, KillRig&, Keep& keep, cudaStream_t stream) {
         const PointToPoint ops[2] = {{PointToPoint::kSend, 1, plain(keep, kBytes), kFloats, kF32},
                                      {PointToPoint::kRecv, 1, plain(keep, kBytes), kFloats, kF32}};
         comm.send_recv(ops, 2, stream);
       }},
      {"MoE dispatch", "",
       [](Communicator&, KillRig& rig, Keep&, cudaStream_t stream) {
         rig.moe.dispatch(rig.x.get(), rig.ids.get(), static_cast<const float*>(rig.weights.get()),
                          KillRig::shape().max_tokens, nullptr, stream);
       }},
      {"MoE combine", "",
       [](Communicator&, KillRig& rig, Keep& keep, cudaStream_t stream) {
         const size_t y_bytes = rig.dispatched.capacity_rows * KillRig::shape().hidden * 2;
         rig.moe.combine(plain(keep, y_bytes), plain(keep, KillRig::token_bytes()), true, stream);
       }},
      {"all-reduce replayed in a CUDA graph (symmetric)", "",
       [](Communicator& comm, KillRig& rig, Keep&, cudaStream_t stream) {
         float* base = static_cast<float*>(rig.symmetric.local());
         GraphHandles graph;
         cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
         comm.all_reduce(base, base + kFloats / 2, kFloats / 2, kF32, ReduceOp::kSum, stream);
         cuda_check(cudaStreamEndCapture(stream, &graph.graph), "cudaStreamEndCapture");
         cuda_check(cudaGraphInstantiate(&graph.exec, graph.graph, 0), "cudaGraphInstantiate");
         cuda_check(cudaGraphLaunch(graph.exec, stream), "cudaGraphLaunch");
       }},  // destroying a launched graph's exec is legal: the launch completes first
  };
}

// Rank 1 (a process of its own) joins an all-reduce, makes the rig, then stops calling; rank 0 makes one call of
// each kind that rank 1 never joins and SIGKILLs it 100 ms later. Rank 0's call ends and check() raises
// kRemoteError naming rank 1 within a second of the kill, in every case.
TEST(Faults, PeerKilledDuringEachKindOfCallIsReportedWithinASecond) {
  if (in_process_mode()) GTEST_SKIP() << "spawns its own peer process";
  for (const KillCase& kill : kill_cases()) {
    with_child_rank("stay", [&](Communicator& comm, pid_t child) {
      StreamHandle stream;
      EXPECT_TRUE(all_reduce_ones(comm, stream.get(), 1024)) << kill.name << ": the first all-reduce, with the child";
      KillRig rig(comm);
      Keep keep;
      kill.call(comm, rig, keep, stream.get());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady) << kill.name << ": finished without rank 1";
      ASSERT_EQ(::kill(child, SIGKILL), 0);
      const Clock::time_point killed_at = Clock::now();
      int status = 0;
      ASSERT_EQ(waitpid(child, &status, 0), child);
      const cudaError_t ended = cudaStreamSynchronize(stream.get());
      const double kernel_ended = seconds_since(killed_at);
      EXPECT_EQ(ended, cudaSuccess) << kill.name << ": " << cudaGetErrorString(ended);
      const bool raised = remote_error_naming_rank_1(comm, killed_at, kill.name);
      const double waited = seconds_since(killed_at);
      std::printf("[faults] SIGKILL during %s: the call ended after %.1f ms, kRemoteError after %.1f ms\n", kill.name,
                  kernel_ended * 1e3, waited * 1e3);
      EXPECT_LT(kernel_ended, 1.0) << kill.name << ": the call outlived the kill by a second";
      EXPECT_TRUE(raised) << kill.name << ": no failure reported " << waited << " s after the kill";
    }, kill.algorithms);
  }
}

// Rank 1 stays alive but never joins rank 0's call: that is no death, so rank 0 waits out its timeout (8 s here:
// init, which spawns rank 1, waits under it too) and then raises kTimeout naming rank 1; it never hangs.
TEST(Faults, StalledPeerEndsInATimeoutNamingIt) {
  if (in_process_mode()) GTEST_SKIP() << "spawns its own peer process";
  with_child_rank("stay", [&](Communicator& comm, pid_t child) {
    StreamHandle stream;
    EXPECT_TRUE(all_reduce_ones(comm, stream.get(), 1024)) << "the first all-reduce, with the child";
    KillRig rig(comm);
    DeviceBuffer send(4096 * sizeof(float)), recv(4096 * sizeof(float));
    const Clock::time_point started = Clock::now();
    comm.all_reduce(send.get(), recv.get(), 4096, DataType::kFloat32, ReduceOp::kSum, stream.get());
    const cudaError_t ended = cudaStreamSynchronize(stream.get());
    const double waited = seconds_since(started);
    EXPECT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
    try {
      comm.check();
      ADD_FAILURE() << "a call rank 1 never joined raised nothing";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kTimeout) << error.what();
      EXPECT_NE(std::string(error.what()).find("rank 1"), std::string::npos) << error.what();
    }
    std::printf("[faults] a stalled peer: kTimeout after %.2f s (timeout %.0f s)\n", waited, comm.timeout_s());
    EXPECT_LT(waited, comm.timeout_s() + 2.0) << "the wait outlived the timeout";
    ::kill(child, SIGKILL);
  }, "", 8.0);
}

// The child rank of the tests above; skipped unless the survivor started this process.
TEST(FaultChild, JoinsOneAllReduceThenLeaves) {
  const char* mode = std::getenv("GPU_TEST_FAULT_CHILD");
  if (mode == nullptr) GTEST_SKIP() << "run by Faults.* as their peer process";
  Rendezvous rendezvous = Rendezvous::at_store(std::getenv("GPU_TEST_FAULT_STORE"), 1, 2, false);
  rendezvous.job_id = std::getenv("GPU_TEST_FAULT_JOB");
  CommOptions options = test_options(30);
  options.device = std::atoi(std::getenv("GPU_TEST_FAULT_DEVICE"));
  if (const char* algorithms = std::getenv("GPU_TEST_FAULT_ALGO")) options.algorithms = algorithms;
  auto comm = std::make_unique<Communicator>(Communicator::init(rendezvous, options));
  make_current(*comm);
  {
    StreamHandle stream;
    if (!all_reduce_ones(*comm, stream.get(), 1024)) std::_Exit(2);
  }
  if (std::string(mode) == "stay") {  // made what rank 0 makes, then stops calling until it is killed
    KillRig rig(*comm);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    std::_Exit(3);
  }
  if (std::string(mode) == "destroy") {
    comm.reset();
    std::_Exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the survivor is waiting in its next call by now
  std::_Exit(0);  // without destroying the communicator
}

}  // namespace
}  // namespace braid::testing

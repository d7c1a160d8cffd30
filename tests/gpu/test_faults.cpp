// Failures a job must survive without a hang: abort() from another thread ends a call that waits on a peer,
// revoke() on one rank ends every rank's, and a peer process that exits without destroying its communicator is
// reported to the survivor within a second (a peer that destroyed it first is no failure). The peer process is this binary run again
// (BRAID_TEST_FAULT_CHILD, FaultChild.*), sharing the survivor's GPU where only one is visible
// (BRAID_ALLOW_SHARED_GPU=1).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "world.hpp"

extern char** environ;

namespace braid::testing {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A float all-reduce of `count` ones; true when the result is the world size everywhere.
bool all_reduce_ones(Communicator& comm, cudaStream_t stream, size_t count) {
  DeviceBuffer send(count * sizeof(float)), recv(count * sizeof(float));
  const std::vector<float> ones(count, 1.0f);
  cuda_check(cudaMemcpy(send.get(), ones.data(), count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  comm.all_reduce(send.get(), recv.get(), count, DataType::kFloat32, ReduceOp::kSum, stream);
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<float> got(count);
  cuda_check(cudaMemcpy(got.data(), recv.get(), count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (float value : got) {
    if (value != static_cast<float>(comm.size())) return false;
  }
  return true;
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

// The last rank leaves; the others revoke and shrink, then all-reduce on the child: ranks keep their order, the
// sum is the survivors' alone, and the parent's symmetric memory is still mapped.
TEST(Faults, SurvivorsShrinkAndCarryOn) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int world = world_size(), gone = world - 1;
  for_each_rank([&](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, test_options(30));
    make_current(comm);
    SymmetricMemory parent_memory = comm.alloc(4096);
    comm.barrier();
    if (context.rank == gone) return;  // leaves without a word
    const auto started = Clock::now();
    comm.revoke();
    Communicator child = comm.shrink({gone});
    std::printf("[faults] rank %d: revoke and shrink %d -> %d ranks: %.1f ms\n", context.rank, world, world - 1,
                seconds_since(started) * 1e3);
    EXPECT_EQ(child.size(), world - 1);
    EXPECT_EQ(child.rank(), context.rank);
    make_current(child);
    StreamHandle stream;
    DeviceBuffer values(1024 * sizeof(int32_t));
    std::vector<int32_t> host(1024, context.rank + 1);
    cuda_check(cudaMemcpy(values.get(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
    child.all_reduce(values.get(), values.get(), 1024, DataType::kInt32, ReduceOp::kSum, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    child.check();
    cuda_check(cudaMemcpy(host.data(), values.get(), host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
    const int32_t survivors_sum = (world - 1) * world / 2;
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

// The survivor's side of a job whose rank 1 is this binary run again with BRAID_TEST_FAULT_CHILD=`mode`: both
// ranks make a communicator and all-reduce once, then the child leaves as `mode` says. Returns the child's pid
// and the survivor's communicator through `body`.
void with_child_rank(const char* mode, const std::function<void(Communicator&, pid_t)>& body) {
  int gpus = 0;
  cuda_check(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  const char* shared = std::getenv("BRAID_ALLOW_SHARED_GPU");
  if (gpus < 2 && (shared == nullptr || std::string(shared) != "1")) {
    GTEST_SKIP() << "one GPU and BRAID_ALLOW_SHARED_GPU unset: the child rank has no GPU of its own";
  }
  StoreHost store;
  const std::string job = std::string("faults/") + mode + "/" + std::to_string(getpid());
  std::vector<std::string> settings = {"BRAID_TEST_FAULT_CHILD=" + std::string(mode),
                                       "BRAID_TEST_FAULT_STORE=" + store.address(), "BRAID_TEST_FAULT_JOB=" + job,
                                       "BRAID_TEST_FAULT_DEVICE=" + std::to_string(gpus > 1 ? 1 : 0)};
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
  CommOptions options = test_options(30);
  options.device = 0;
  {
    Communicator comm = Communicator::init(rendezvous, options);
    make_current(comm);
    body(comm, child);
  }
  int status = 0;
  waitpid(child, &status, 0);  // reaped already where the body waited for it
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
    // The watch runs on its own thread: give its publication until the second is over.
    bool raised = false;
    while (!raised && seconds_since(exited_at) < 1.0) {
      try {
        comm.check();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } catch (const Error& error) {
        raised = true;
        EXPECT_EQ(error.code(), ErrorCode::kRemoteError) << error.what();
        EXPECT_NE(std::string(error.what()).find("rank 1"), std::string::npos) << error.what();
      }
    }
    const double waited = seconds_since(exited_at);
    std::printf("[faults] the peer's exit to kRemoteError: %.1f ms\n", waited * 1e3);
    EXPECT_TRUE(raised) << "no failure reported " << waited << " s after rank 1 exited";
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

// The child rank of the tests above; skipped unless the survivor started this process.
TEST(FaultChild, JoinsOneAllReduceThenLeaves) {
  const char* mode = std::getenv("BRAID_TEST_FAULT_CHILD");
  if (mode == nullptr) GTEST_SKIP() << "run by Faults.* as their peer process";
  Rendezvous rendezvous = Rendezvous::at_store(std::getenv("BRAID_TEST_FAULT_STORE"), 1, 2, false);
  rendezvous.job_id = std::getenv("BRAID_TEST_FAULT_JOB");
  CommOptions options = test_options(30);
  options.device = std::atoi(std::getenv("BRAID_TEST_FAULT_DEVICE"));
  auto comm = std::make_unique<Communicator>(Communicator::init(rendezvous, options));
  make_current(*comm);
  {
    StreamHandle stream;
    if (!all_reduce_ones(*comm, stream.get(), 1024)) std::_Exit(2);
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

// The NCCL backend's abort against calls other threads are making (NOTE [NCCL calls and abort] in
// src/backends/nccl/nccl_backend.hpp), on one GPU, with fake_nccl.cpp's library standing in for NCCL so that a
// call can be held inside it:
//   - an abort while a call is inside NCCL waits for it to return, then aborts; every later call, check() included,
//     raises kAborted without entering NCCL;
//   - a call that never returns by itself (blocked on a peer) is aborted under after kAbortWaitForCallsS, and
//     raises kAborted;
//   - threads calling every kind of call in a loop while another aborts: no abort comes while a call is inside
//     NCCL, and no call enters after it.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_backend.hpp"
#include "braid/error.hpp"

namespace braid::testing {
namespace {

using detail::NcclBackend;
using detail::NcclLibrary;
using detail::NcclRegisterMode;
using Clock = std::chrono::steady_clock;

struct FakeNcclCounts {
  int entered, calls_after_abort, aborts_during_calls, aborted;
};

// fake_nccl.cpp's library, built beside this binary, and its test controls.
struct FakeNccl {
  std::shared_ptr<NcclLibrary> library;
  void (*hold)(ncclComm_t, int) = nullptr;
  int (*wait_entered)(ncclComm_t, int, int) = nullptr;
  FakeNcclCounts (*counts)(ncclComm_t) = nullptr;
};

std::string fake_library_path() {
  std::string exe(4096, '\0');
  const ssize_t length = readlink("/proc/self/exe", exe.data(), exe.size());
  if (length <= 0) return "libbraid_fake_nccl.so";
  exe.resize(static_cast<size_t>(length));
  return exe.substr(0, exe.rfind('/') + 1) + "libbraid_fake_nccl.so";
}

// The fake, or a failed assertion naming why it could not be loaded.
void load_fake(FakeNccl& fake) {
  const std::string path = fake_library_path();
  fake.library = NcclLibrary::load(path);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << path << " is not loaded";
  fake.hold = reinterpret_cast<decltype(fake.hold)>(dlsym(handle, "fake_nccl_hold"));
  fake.wait_entered = reinterpret_cast<decltype(fake.wait_entered)>(dlsym(handle, "fake_nccl_wait_entered"));
  fake.counts = reinterpret_cast<decltype(fake.counts)>(dlsym(handle, "fake_nccl_counts"));
  dlclose(handle);  // NcclLibrary keeps it open
  ASSERT_TRUE(fake.hold != nullptr && fake.wait_entered != nullptr && fake.counts != nullptr) << path;
}

#define REQUIRE_GPU()                                                   \
  int gpu_count = 0;                                                    \
  if (cudaGetDeviceCount(&gpu_count) != cudaSuccess || gpu_count == 0) \
  GTEST_SKIP() << "no GPU"

std::unique_ptr<NcclBackend> make_backend(const FakeNccl& fake, double timeout_s = 30.0) {
  int device = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  return std::make_unique<NcclBackend>(fake.library, 0, 2, device, NcclBackend::make_unique_id(*fake.library),
                                       NcclRegisterMode::kTry, timeout_s);
}

// The error code `body` raised, or nothing.
template <typename Body>
std::optional<ErrorCode> raised(Body&& body) {
  try {
    body();
  } catch (const Error& error) {
    return error.code();
  }
  return std::nullopt;
}

// The fake loaded, a stream, and a backend on it; skipped where there is no GPU.
class NcclAbort : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    ASSERT_NO_FATAL_FAILURE(load_fake(fake_));
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    backend_ = make_backend(fake_);
    comm_ = backend_->comm();
  }
  void TearDown() override {
    backend_.reset();
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  FakeNccl fake_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<NcclBackend> backend_;
  ncclComm_t comm_ = nullptr;
  // Stand-ins for device pointers: the fake never reads them.
  float* send_ = reinterpret_cast<float*>(uintptr_t(0x1000));
  float* recv_ = reinterpret_cast<float*>(uintptr_t(0x2000));
};

TEST_F(NcclAbort, WaitsForTheCallInsideNcclThenRefusesEveryCall) {
  FakeNccl& fake = fake_;
  std::unique_ptr<NcclBackend>& backend = backend_;
  const ncclComm_t comm = comm_;

  fake.hold(comm, 1);
  std::optional<ErrorCode> call_error;
  std::thread caller([&] {
    call_error = raised([&] { backend->all_reduce(send_, recv_, 1024, DataType::kFloat32, ReduceOp::kSum, stream_); });
  });
  ASSERT_TRUE(fake.wait_entered(comm, 1, 10'000)) << "the all_reduce never entered NCCL";

  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    backend->abort();
    aborted = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(aborted.load()) << "abort() did not wait for the call inside NCCL";
  fake.hold(comm, 0);
  aborter.join();
  caller.join();
  EXPECT_FALSE(call_error.has_value()) << "the call held inside NCCL failed: " << static_cast<int>(*call_error);

  FakeNcclCounts seen = fake.counts(comm);
  EXPECT_EQ(seen.aborted, 1);
  EXPECT_EQ(seen.aborts_during_calls, 0) << "ncclCommAbort came while a call was inside NCCL";
  const int entered = seen.entered;

  // After the abort: every call raises kAborted before it reaches NCCL.
  EXPECT_EQ(raised([&] { backend->all_reduce(send_, recv_, 8, DataType::kFloat32, ReduceOp::kSum, stream_); }),
            ErrorCode::kAborted);
  EXPECT_EQ(raised([&] { backend->all_gather(send_, recv_, 8, DataType::kFloat32, stream_); }), ErrorCode::kAborted);
  EXPECT_EQ(raised([&] { backend->broadcast(send_, recv_, 8, DataType::kFloat32, 0, stream_); }), ErrorCode::kAborted);
  EXPECT_EQ(raised([&] { backend->check(); }), ErrorCode::kAborted);
  EXPECT_EQ(raised([&] { backend->ensure_registered(1, recv_, 4096); }), ErrorCode::kAborted);
  backend->forget_registered(1);
  seen = fake.counts(comm);
  EXPECT_EQ(seen.entered, entered) << "a call entered NCCL after the abort";
  EXPECT_EQ(seen.calls_after_abort, 0);
  backend.reset();  // after an abort the destructor makes no NCCL call
  EXPECT_EQ(fake.counts(comm).entered, entered);
}

TEST_F(NcclAbort, ACallThatNeverReturnsIsAbortedUnderAfterTheWait) {
  FakeNccl& fake = fake_;
  std::unique_ptr<NcclBackend>& backend = backend_;
  const ncclComm_t comm = comm_;

  fake.hold(comm, 1);  // released by the abort alone, as NCCL's abort flag ends a wait for a peer
  std::optional<ErrorCode> call_error;
  std::thread caller([&] {
    call_error = raised([&] { backend->reduce_scatter(send_, recv_, 64, DataType::kBFloat16, ReduceOp::kSum, stream_); });
  });
  ASSERT_TRUE(fake.wait_entered(comm, 1, 10'000)) << "the reduce_scatter never entered NCCL";
  const auto start = Clock::now();
  backend->abort();
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  caller.join();
  EXPECT_GE(took, 0.9 * NcclBackend::kAbortWaitForCallsS) << "abort() did not wait for the call";
  EXPECT_LE(took, NcclBackend::kAbortWaitForCallsS + 2.0) << "abort() waited past its bound";
  EXPECT_EQ(call_error, std::optional<ErrorCode>(ErrorCode::kAborted)) << "the call the abort ended";
  const FakeNcclCounts seen = fake.counts(comm);
  EXPECT_EQ(seen.aborted, 1);
  EXPECT_EQ(seen.aborts_during_calls, 1);
  EXPECT_EQ(raised([&] { backend->check(); }), ErrorCode::kAborted);
}

// Threads calling every kind of backend call in a loop; another aborts after a random delay. Many rounds.
TEST_F(NcclAbort, NoAbortComesWhileACallIsInsideNcclAndNoCallEntersAfter) {
  const FakeNccl& fake = fake_;
  constexpr int kRounds = 200, kCallers = 4;
  std::mt19937 random(20261204u);
  int rounds_with_calls = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto backend = make_backend(fake);
    ncclComm_t comm = backend->comm();
    std::atomic<bool> stop{false};
    std::atomic<int> unexpected{0};  // a caller's error other than kAborted
    std::vector<std::thread> callers;
    for (int c = 0; c < kCallers; ++c) {
      callers.emplace_back([&, c] {
        cudaSetDevice(backend->device());
        for (uint64_t i = 0; !stop.load(); ++i) {
          const std::optional<ErrorCode> error = raised([&] {
            switch ((i + c) % 5) {
              case 0: backend->all_reduce(send_, recv_, 8, DataType::kFloat32, ReduceOp::kSum, stream_); break;
              case 1: backend->reduce(send_, recv_, 8, DataType::kFloat32, ReduceOp::kMax, 1, stream_); break;
              case 2: backend->check(); break;
              case 3: backend->ensure_registered(1 + (i % 7), recv_, 4096); break;
              default: backend->forget_registered(1 + (i % 7)); break;
            }
          });
          if (error.has_value() && *error != ErrorCode::kAborted) ++unexpected;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 2000));
    backend->abort();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    stop = true;
    for (std::thread& caller : callers) caller.join();
    const FakeNcclCounts seen = fake.counts(comm);
    ASSERT_EQ(seen.aborts_during_calls, 0) << "round " << round << ": ncclCommAbort came while a call was inside NCCL";
    ASSERT_EQ(seen.calls_after_abort, 0) << "round " << round << ": a call entered NCCL after the abort";
    ASSERT_EQ(unexpected.load(), 0) << "round " << round;
    if (seen.entered > 0) ++rounds_with_calls;
  }
  EXPECT_GT(rounds_with_calls, kRounds / 2) << "the callers rarely reached NCCL before the abort: the test shows little";
}

}  // namespace
}  // namespace braid::testing

// The NCCL backend's watchdog (src/backends/nccl/nccl_watchdog.hpp) on one GPU, with spin kernels standing in for
// NCCL operations (NcclCommunicator.TimeoutAbortsTheWaitAndNamesTheOperation runs it against a real NCCL peer
// that skips a call):
//   - short operations, and watched operations back to back that together outlive the timeout, never expire: an
//     operation's clock starts when the one before it on its stream finished;
//   - an operation enqueued during a graph capture records nothing into the graph;
//   - an operation that outlives the timeout expires once, within a poll of the timeout, naming itself;
//   - a host call that does not return (its end event never recorded) expires the same way.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "backends/nccl/nccl_watchdog.hpp"
#include "spin_kernel.hpp"

namespace braid::testing {
namespace {

using detail::NcclWatchdog;
using Clock = std::chrono::steady_clock;

void cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// What on_expiry saw.
struct Expiries {
  std::mutex mutex;
  int count = 0;
  std::string message;
  std::function<void(const std::string&)> callback() {
    return [this](const std::string& text) {
      std::lock_guard<std::mutex> lock(mutex);
      ++count;
      message = text;
    };
  }
};

// Waits up to `limit_s` for the watchdog to expire; the seconds it took from `start`, or -1.
double wait_for_expiry(const NcclWatchdog& watchdog, Clock::time_point start, double limit_s) {
  while (!watchdog.expired() && seconds_since(start) < limit_s) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return watchdog.expired() ? seconds_since(start) : -1;
}

constexpr double kTimeoutS = 1.0;

// A watchdog with a 1 s timeout on the current GPU, what its expiries saw, and a stream of the test's own.
class NcclWatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int device = 0;
    cuda(cudaGetDevice(&device), "cudaGetDevice");
    watchdog_ = std::make_unique<NcclWatchdog>(device, kTimeoutS, "test rank", expiries_.callback());
    cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
  }
  void TearDown() override {
    cudaStreamSynchronize(stream_);
    watchdog_.reset();
    cudaStreamDestroy(stream_);
  }
  Expiries expiries_;
  std::unique_ptr<NcclWatchdog> watchdog_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(NcclWatchdogTest, ExpiresOnlyOnAnOperationThatOutlivesTheTimeout) {
  NcclWatchdog& watchdog = *watchdog_;
  Expiries& expiries = expiries_;
  const cudaStream_t stream = stream_;

  for (int i = 0; i < 200; ++i) {
    const NcclWatchdog::Scope watched(watchdog, "short operation", stream);
    cuda(spin_on_stream(stream, 20'000), "spin");  // 20 us
  }
  // Three watched operations back to back, 1.8 s together, each shorter than the timeout: each one's clock
  // starts when the one before it finished.
  for (int i = 0; i < 3; ++i) {
    const NcclWatchdog::Scope watched(watchdog, "operation behind another", stream);
    cuda(spin_on_stream(stream, 600'000'000u), "spin");
  }
  // Captured: the scope records no event into the graph (the graph holds the kernel alone).
  cudaStream_t capturing;
  cuda(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking), "stream");
  cuda(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeThreadLocal), "capture");
  {
    const NcclWatchdog::Scope watched(watchdog, "captured operation", capturing);
    cuda(spin_on_stream(capturing, 1'000), "spin");
  }
  cudaGraph_t graph;
  cuda(cudaStreamEndCapture(capturing, &graph), "end capture");
  size_t nodes = 0;
  cuda(cudaGraphGetNodes(graph, nullptr, &nodes), "nodes");
  EXPECT_EQ(nodes, 1u) << "the watchdog recorded into a captured graph";
  cudaGraphDestroy(graph);
  cudaStreamDestroy(capturing);
  cuda(cudaStreamSynchronize(stream), "sync");
  std::this_thread::sleep_for(std::chrono::duration<double>(kTimeoutS + 0.3));  // time to see a false expiry
  EXPECT_FALSE(watchdog.expired()) << watchdog.message();

  // Stuck: a 4 s operation expires about a timeout after it starts.
  const auto start = Clock::now();
  {
    const NcclWatchdog::Scope watched(watchdog, "stuck operation", stream);
    cuda(spin_on_stream(stream, 4'000'000'000u), "spin");
  }
  const double took = wait_for_expiry(watchdog, start, 10.0);
  EXPECT_GE(took, 0.9 * kTimeoutS) << "expired before the timeout";
  EXPECT_LE(took, kTimeoutS + 1.0) << "expired late (or never: -1)";
  EXPECT_NE(watchdog.message().find("stuck operation"), std::string::npos) << watchdog.message();
  EXPECT_NE(watchdog.message().find("test rank"), std::string::npos) << watchdog.message();
  cuda(cudaStreamSynchronize(stream), "sync");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::lock_guard<std::mutex> lock(expiries.mutex);
  EXPECT_EQ(expiries.count, 1);
  EXPECT_EQ(expiries.message, watchdog.message());
}

TEST_F(NcclWatchdogTest, ExpiresOnAHostCallThatDoesNotReturn) {
  NcclWatchdog& watchdog = *watchdog_;
  const cudaStream_t stream = stream_;
  const auto start = Clock::now();
  double took = -1;
  {
    const NcclWatchdog::Scope watched(watchdog, "blocked host call", stream);
    took = wait_for_expiry(watchdog, start, 5.0);  // "inside" the call: its end event is not recorded yet
  }
  EXPECT_GE(took, 0.9 * kTimeoutS);
  EXPECT_LE(took, kTimeoutS + 1.0) << "expired late (or never: -1)";
  EXPECT_NE(watchdog.message().find("blocked host call"), std::string::npos) << watchdog.message();
}

}  // namespace
}  // namespace braid::testing

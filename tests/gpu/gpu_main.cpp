// Main of braid_gpu_tests. Exit code 77 means "skipped" to CTest (SKIP_RETURN_CODE): no GPU here, or fewer
// GPUs than ranks asked for. Flags before GoogleTest's:
//   --world=N         ranks as threads (default: every visible GPU)
//   --print-gpu-count print the number of visible GPUs (exit 77 when none) and exit
//   --crash-rank=R    launcher test: rank R aborts after init while the others wait in a barrier
//   --seed=S          tests on random cases take seed S (decimal, or 0x hex) instead of a fresh one: a failure's,
//                     to replay its cases
//   --skip-if-gpus=N  exit 77 (skipped) when exactly N GPUs are visible: an entry for "every GPU" that another
//                     entry for N ranks already covers
//   --test-watchdog=S a test still running after S seconds is named on stderr and the process exits 124, so a
//                     runner can go on with the tests after it (bench/dev/shared_suite_run.sh); with
//                     GPU_TEST_WATCHDOG_HOLD_S=H it waits H seconds first, for a debugger to take the stacks
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>

#include "collective_reference.hpp"
#include "world.hpp"

namespace {

constexpr int kSkipped = 77;

int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

// Under braid-run: rank R aborts; the others must be stopped by the launcher, not wait out their timeout.
int crash_rank_mode(int crash_rank) {
  braid::Communicator comm = braid::Communicator::init(braid::Rendezvous::from_env(), braid::testing::test_options(120));
  std::printf("rank %d initialised\n", comm.rank());
  std::fflush(stdout);
  if (comm.rank() == crash_rank) std::abort();
  comm.barrier();  // never completes: the crashed rank does not arrive
  return 0;
}

// Names the test that outlives its limit and ends the process: a hang costs one limit, not the entry's timeout.
// The state lives on the heap and is never freed: the watching thread is detached and outlives the listener,
// which GoogleTest deletes at exit.
class TestWatchdog : public ::testing::EmptyTestEventListener {
 public:
  explicit TestWatchdog(int limit_s) : state_(new State{limit_s}) {
    std::thread([state = state_] { watch(*state); }).detach();
  }
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->name = std::string(info.test_suite_name()) + "." + info.name();
    state_->started = std::chrono::steady_clock::now();
    state_->running = true;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->running = false;
  }

 private:
  struct State {
    const int limit_s;
    std::mutex mutex;
    std::string name;
    std::chrono::steady_clock::time_point started;
    bool running = false;
  };

  static void watch(State& state) {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::lock_guard<std::mutex> lock(state.mutex);
      if (state.running && std::chrono::steady_clock::now() - state.started > std::chrono::seconds(state.limit_s)) {
        std::fprintf(stderr, "[ WATCHDOG ] %s still running after %d s: exiting\n", state.name.c_str(), state.limit_s);
        std::fflush(stdout);
        std::fflush(stderr);
        const char* hold = std::getenv("GPU_TEST_WATCHDOG_HOLD_S");
        if (hold != nullptr) std::this_thread::sleep_for(std::chrono::seconds(std::atoi(hold)));
        _exit(124);
      }
    }
  }

  State* const state_;
};

}  // namespace

int main(int argc, char** argv) {
  int world = -1;
  int crash_rank = -1;
  int skip_if_gpus = -1;
  int watchdog_s = 0;
  bool print_count = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--world=", 8) == 0) world = std::atoi(argv[i] + 8);
    else if (std::strncmp(argv[i], "--crash-rank=", 13) == 0) crash_rank = std::atoi(argv[i] + 13);
    else if (std::strncmp(argv[i], "--skip-if-gpus=", 15) == 0) skip_if_gpus = std::atoi(argv[i] + 15);
    else if (std::strncmp(argv[i], "--test-watchdog=", 16) == 0) watchdog_s = std::atoi(argv[i] + 16);
    else if (std::strncmp(argv[i], "--seed=", 7) == 0) {
      char* end = nullptr;
      errno = 0;
      const unsigned long long seed = std::strtoull(argv[i] + 7, &end, 0);
      if (errno != 0 || end == argv[i] + 7 || *end != '\0' || argv[i][7] == '-') {
        std::fprintf(stderr, "--seed= takes a 64-bit number (decimal, or hex with 0x), got '%s'\n", argv[i] + 7);
        return 2;
      }
      braid::testing::replay_seed(seed);
    }
    else if (std::strcmp(argv[i], "--print-gpu-count") == 0) print_count = true;
    else argv[kept++] = argv[i];
  }
  argc = kept;
  // BRAID_ALLOW_SHARED_GPU=1: more ranks than GPUs, ranks sharing them round robin (a correctness mode).
  // NOTE [shared-GPU module loading]: ranks that share a GPU as threads share its context, and with CUDA's lazy loading a
  // kernel launched for the first time (a spin, a recorder, an expert) while a peer's collective spins waiting for
  // this rank runs only after that collective, which never ends: the two serialise into a hang. Every module is loaded up front instead (before the first CUDA call).
  const char* shared = std::getenv("BRAID_ALLOW_SHARED_GPU");
  const bool shared_gpus = shared != nullptr && std::strcmp(shared, "1") == 0;
  // NOTE [shared hardware queues] (comm/topology.hpp): ranks as threads share the context's hardware queues too.
  if (shared_gpus) {
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  }

  const int gpus = visible_gpus();
  if (print_count) {
    std::printf("%d\n", gpus);
    return gpus > 0 ? 0 : kSkipped;
  }
  if (gpus == 0) {
    std::printf("SKIPPED: no CUDA device on this machine; GPU tests did not run\n");
    return kSkipped;
  }
  if (crash_rank >= 0) return crash_rank_mode(crash_rank);
  if (gpus == skip_if_gpus) {
    std::printf("SKIPPED: all %d GPUs is the world of the %d-rank entry, which runs the same tests\n", gpus, gpus);
    return kSkipped;
  }

  if (braid::testing::in_process_mode()) {
    if (braid::testing::world_size() > gpus && !shared_gpus) {
      std::printf("SKIPPED: %d ranks but only %d GPUs\n", braid::testing::world_size(), gpus);
      return kSkipped;
    }
  } else {
    if (world < 0) world = gpus;
    if (world > gpus && !shared_gpus) {
      std::printf("SKIPPED: --world=%d but only %d GPUs (BRAID_ALLOW_SHARED_GPU=1 lets ranks share them)\n", world, gpus);
      return kSkipped;
    }
    braid::testing::set_thread_world(world);
  }
  std::printf("braid GPU tests: %d rank(s) as %s, %d GPU(s) visible%s\n", braid::testing::world_size(),
              braid::testing::in_process_mode() ? "processes (braid-run)" : "threads", gpus,
              shared_gpus && braid::testing::world_size() > gpus ? ", ranks sharing them" : "");
  ::testing::InitGoogleTest(&argc, argv);
  if (watchdog_s > 0) ::testing::UnitTest::GetInstance()->listeners().Append(new TestWatchdog(watchdog_s));
  return RUN_ALL_TESTS();
}

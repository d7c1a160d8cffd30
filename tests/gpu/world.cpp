#include "world.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace braid::testing {
namespace {
int g_thread_world = 1;

// The ranks of one for_each_rank as threads; every thread holds it while its body runs.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int parties) : parties_(parties) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long long generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    if (!changed_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation; })) {
      throw std::runtime_error("host_barrier: a rank did not arrive within 60 s");
    }
  }

 private:
  const int parties_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  unsigned long long generation_ = 0;
};
thread_local ThreadBarrier* t_barrier = nullptr;

// Device memory the rank threads of the running test released while ranks share GPUs (free_when_ranks_end).
std::mutex g_released_mutex;
std::vector<void*> g_released;

void free_released() {
  std::lock_guard<std::mutex> lock(g_released_mutex);
  for (void* pointer : g_released) cudaFree(pointer);
  g_released.clear();
}

// PinnedStaging's free buffers: never freed (cudaFreeHost at exit could wait for the device).
std::mutex g_staging_mutex;
std::vector<void*> g_staging;

void* allocate_staging() {
  void* pointer = nullptr;
  const cudaError_t result = cudaHostAlloc(&pointer, PinnedStaging::kBytes, cudaHostAllocPortable);
  if (result != cudaSuccess) throw std::runtime_error(std::string("cudaHostAlloc (staging): ") + cudaGetErrorString(result));
  return pointer;
}

// At least `buffers` free staging buffers, before any rank thread starts. Not in a braid-run process: its one rank
// has a context of its own, and an allocation before the rank chose its GPU would make a context on GPU 0.
void fill_staging_pool(int buffers) {
  std::lock_guard<std::mutex> lock(g_staging_mutex);
  while (g_staging.size() < static_cast<size_t>(buffers)) g_staging.push_back(allocate_staging());
}

std::string current_test_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info == nullptr ? "none" : std::string(info->test_suite_name()) + "." + info->name();
}

void run_guarded(int rank, const std::function<void(const RankContext&)>& body, const RankContext& context) {
  try {
    body(context);
  } catch (const std::exception& error) {
    ADD_FAILURE() << "rank " << rank << " threw: " << error.what();
  }
}
}  // namespace

PinnedStaging::PinnedStaging() {
  {
    std::lock_guard<std::mutex> lock(g_staging_mutex);
    if (!g_staging.empty()) {
      pointer_ = g_staging.back();
      g_staging.pop_back();
      return;
    }
  }
  pointer_ = allocate_staging();
}

PinnedStaging::~PinnedStaging() {
  std::lock_guard<std::mutex> lock(g_staging_mutex);
  g_staging.push_back(pointer_);
}

void make_current(const Communicator& comm) {
  cudaError_t result = cudaSetDevice(comm.device());
  if (result != cudaSuccess) throw std::runtime_error(std::string("cudaSetDevice: ") + cudaGetErrorString(result));
}

bool in_process_mode() { return std::getenv("BRAID_RANK") != nullptr; }
void set_thread_world(int world) { g_thread_world = world; }
bool ranks_share_gpus() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) return false;
  return world_size() > gpus;
}

bool ranks_share_a_context() { return ranks_share_gpus() && !in_process_mode(); }

int world_size() { return in_process_mode() ? std::atoi(std::getenv("BRAID_WORLD_SIZE")) : g_thread_world; }

CommOptions test_options(double timeout_s) {
  CommOptions options;
  options.timeout_s = timeout_s;
  return options;
}

void for_each_rank(const std::function<void(const RankContext&)>& body) {
  const std::string test = current_test_name();
  if (in_process_mode()) {
    Rendezvous rendezvous = Rendezvous::from_env();
    rendezvous.job_id += "/" + test;  // each test's communicators in a namespace of their own
    run_guarded(rendezvous.rank, body, RankContext{rendezvous.rank, rendezvous.size, rendezvous});
    return;
  }
  fill_staging_pool(g_thread_world);  // the rank threads share their GPUs' contexts (NOTE [shared-GPU waits])
  StoreHost store;
  ThreadBarrier barrier(g_thread_world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < g_thread_world; ++rank) {
    threads.emplace_back([&, rank] {
      t_barrier = &barrier;
      Rendezvous rendezvous = Rendezvous::at_store(store.address(), rank, g_thread_world, false);
      rendezvous.job_id = test;
      run_guarded(rank, body, RankContext{rank, g_thread_world, rendezvous});
    });
  }
  for (std::thread& thread : threads) thread.join();
  free_released();  // no rank's kernel is left to wait for
}

void init_c_communicator(const RankContext& context, braidComm_t* comm) {
  const std::string address = context.rendezvous.store_host + ":" + std::to_string(context.rendezvous.store_port);
  ASSERT_EQ(braidCommInitRank(comm, address.c_str(), context.rank, context.world, 0, -1), braidSuccess)
      << braidGetLastError();
  int device = -1;
  ASSERT_EQ(braidCommDevice(*comm, &device), braidSuccess);
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
}

void host_barrier() {
  if (t_barrier != nullptr) t_barrier->arrive_and_wait();
}

void device_synchronize() {
  const bool shared = t_barrier != nullptr && ranks_share_gpus();
  if (shared) host_barrier();
  const cudaError_t result = cudaDeviceSynchronize();
  if (shared) host_barrier();
  if (result != cudaSuccess) throw std::runtime_error(std::string("cudaDeviceSynchronize: ") + cudaGetErrorString(result));
}

void device_free(void* pointer) {
  const bool shared = t_barrier != nullptr && ranks_share_gpus();
  if (shared) host_barrier();
  const cudaError_t result = cudaFree(pointer);
  if (shared) host_barrier();
  if (result != cudaSuccess) throw std::runtime_error(std::string("cudaFree: ") + cudaGetErrorString(result));
}

cudaGraphExec_t instantiate_on_every_rank(cudaGraph_t graph, cudaStream_t stream) {
  cudaGraphExec_t exec = nullptr;
  cudaError_t result = cudaGraphInstantiate(&exec, graph, 0);
  if (result == cudaSuccess) result = cudaGraphUpload(exec, stream);
  if (result == cudaSuccess) result = cudaStreamSynchronize(stream);
  if (result != cudaSuccess) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    throw std::runtime_error(std::string("cudaGraphInstantiate and upload: ") + cudaGetErrorString(result));
  }
  if (t_barrier != nullptr && ranks_share_gpus()) host_barrier();
  return exec;
}

void replay_graph(cudaGraphExec_t exec, cudaStream_t stream, int times) {
  const bool shared = t_barrier != nullptr && ranks_share_gpus();
  auto check = [](cudaError_t result, const char* what) {
    if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
  };
  for (int i = 0; i < times; ++i) {
    check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    if (shared) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (between replays)");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (replays)");
}

LockstepBuffer::LockstepBuffer(size_t bytes) {
  const cudaError_t result = cudaMalloc(&pointer_, bytes == 0 ? 1 : bytes);
  if (result != cudaSuccess) throw std::runtime_error(std::string("cudaMalloc: ") + cudaGetErrorString(result));
}

LockstepBuffer::~LockstepBuffer() {
  try {
    device_free(pointer_);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "LockstepBuffer: %s\n", error.what());
  }
}

void free_when_ranks_end(void* pointer) {
  if (t_barrier != nullptr && ranks_share_gpus()) {
    std::lock_guard<std::mutex> lock(g_released_mutex);
    g_released.push_back(pointer);
    return;
  }
  cudaFree(pointer);
}

void with_communicator(const std::function<void(Communicator&)>& body, const CommOptions& options) {
  for_each_rank([&](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, options);
    make_current(comm);
    // Destroying the communicator frees device memory, and cudaFree waits for every kernel of the GPU while it
    // holds up the other threads' launches there: where ranks share GPUs, a rank done first would stall a peer
    // still launching its last call, and a third rank spinning on that peer until the timeout. So every rank
    // ends its body before any destroys its communicator (NOTE [shared-GPU waits]).
    std::exception_ptr failure;
    try {
      body(comm);
    } catch (...) {
      failure = std::current_exception();
    }
    if (ranks_share_gpus()) {
      try {
        host_barrier();
      } catch (...) {
        if (!failure) throw;  // the body's own failure is the one to report
      }
    }
    if (failure) std::rethrow_exception(failure);
  });
}

}  // namespace braid::testing

#include "world.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

namespace braid::testing {
namespace {
int g_thread_world = 1;

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
  StoreHost store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < g_thread_world; ++rank) {
    threads.emplace_back([&, rank] {
      Rendezvous rendezvous = Rendezvous::at_store(store.address(), rank, g_thread_world, false);
      rendezvous.job_id = test;
      run_guarded(rank, body, RankContext{rank, g_thread_world, rendezvous});
    });
  }
  for (std::thread& thread : threads) thread.join();
}

void with_communicator(const std::function<void(Communicator&)>& body, const CommOptions& options) {
  for_each_rank([&](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, options);
    make_current(comm);
    body(comm);
  });
}

}  // namespace braid::testing

// braid-bench: braid's collectives timed and checked against a host reference, nccl-tests style, optionally
// beside NCCL on the same GPUs (--compare nccl); --smoke runs the symmetric-memory smoke run instead, --moe the MoE
// dispatch/combine benchmark (moe.cpp and the moe_*.cpp files).
//   braid-bench [--coll allreduce|...|all] [-b 8] [-e 128M] [-f 2] [-d float32] [-o sum] [...]   ranks as threads
//   braid-run -n N braid-bench [...]                                                         ranks as processes
// This file starts the ranks and turns failures into messages and exit codes; options.cpp has the flags,
// bench.cpp the loop, reference.cpp the check, nccl.cpp NCCL, report.cpp the output, smoke.cpp the smoke run.
#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "braid/braid.hpp"
#include "moe.hpp"
#include "nccl.hpp"
#include "options.hpp"
#include "smoke.hpp"

namespace {

using braid::bench::Options;

// One rank, start to end. Every failure (braid::Error, NCCL, CUDA) becomes "braid-bench: rank R: ..." and 1;
// on_failure (threads mode) hears of it at once.
int run_rank(const braid::Rendezvous& rendezvous, const Options& options,
             const std::shared_ptr<braid::bench::NcclLibrary>& nccl, const std::function<void()>& on_failure = {}) {
  std::unique_ptr<braid::Communicator> comm;
  try {
    braid::CommOptions comm_options;
    comm_options.timeout_s = options.timeout_s;
    comm = std::make_unique<braid::Communicator>(braid::Communicator::init(rendezvous, comm_options));
    if (options.smoke) {
      return braid::bench::smoke_run(*comm, options.min_bytes, options.max_bytes, options.step_factor) == 0 ? 0 : 1;
    }
    const uint64_t wrong = options.moe ? braid::bench::moe_run(*comm, options, nccl)
                                       : braid::bench::bench_run(*comm, options, nccl);
    if (wrong > 0 && comm->rank() == 0) {
      std::fprintf(stderr, "braid-bench: %llu elements wrong in all (see the #wrong columns and the lines above)\n",
                   static_cast<unsigned long long>(wrong));
    }
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "braid-bench: rank %d: %s\n", rendezvous.rank, error.what());
    std::fflush(stderr);
    // Left undestroyed: its teardown frees device memory, which waits for kernels that may spin on a failed
    // peer until the timeout. The process exits next.
    (void)comm.release();
    if (on_failure) on_failure();
    return 1;
  }
}

// Ranks as threads of this process. Once one rank fails the others cannot finish (every call needs all
// ranks), and a peer blocked inside NCCL would wait forever: they get a short grace to report their own
// errors, then the process exits.
int run_threads(const Options& options, const std::shared_ptr<braid::bench::NcclLibrary>& nccl) {
  int gpus = 0;
  cudaError_t result = cudaGetDeviceCount(&gpus);
  if (result != cudaSuccess || gpus == 0) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (result == cudaErrorInsufficientDriver && driver > 0) {
      std::fprintf(stderr, "braid-bench: no CUDA device usable: the NVIDIA driver supports CUDA %d.%d, older than the "
                   "CUDA %d.%d runtime braid is built with; install a driver of the R580 series or newer\n",
                   driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    } else {
      std::fprintf(stderr, "braid-bench: no CUDA device on this machine (%s)\n",
                   result == cudaSuccess ? "device count is 0" : driver == 0 ? "no NVIDIA driver is installed" : cudaGetErrorName(result));
    }
    return 1;
  }
  const int world = options.threads > 0 ? options.threads : gpus;
  if (world > gpus) {
    std::printf("# %d ranks on %d GPU(s): ranks share GPUs (BRAID_ALLOW_SHARED_GPU=1 must be set), a correctness mode "
                "whose timings mean nothing\n", world, gpus);
  }
  braid::StoreHost store;
  std::mutex mutex;
  std::condition_variable changed;
  int finished = 0, failed = 0;
  std::vector<int> codes(world, 0);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      auto on_failure = [&] {
        std::lock_guard<std::mutex> lock(mutex);
        ++failed;
        changed.notify_all();
      };
      const int code =
          run_rank(braid::Rendezvous::at_store(store.address(), rank, world, false), options, nccl, on_failure);
      std::lock_guard<std::mutex> lock(mutex);
      codes[rank] = code;
      ++finished;
      changed.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return finished == world || failed > 0; });
    if (finished < world &&
        !changed.wait_for(lock, std::chrono::seconds(10), [&] { return finished == world; })) {
      std::fprintf(stderr, "braid-bench: a rank failed and %d rank(s) did not finish within 10 s; exiting\n",
                   world - finished);
      std::fflush(stderr);
      std::_Exit(1);  // the stuck threads cannot be joined
    }
  }
  for (std::thread& rank : ranks) rank.join();
  for (int code : codes) {
    if (code != 0) return code;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = braid::bench::parse_options(argc, argv, options)) return *exit_code;

  std::shared_ptr<braid::bench::NcclLibrary> nccl;
  if (options.compare_nccl && !options.smoke) {
    // NVLink multicast (NVLS) stays off unless the user asks for it: braid does not use it by default, and a
    // multicast program can take a shared host's GPUs out of service. Set before any thread starts.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    // Connect NCCL's peers at init, not lazily at its first collective: a lazy connect needs every rank's host
    // thread, and a rank whose GPU is busy in a braid kernel waiting for that very peer would deadlock with it.
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    try {
      nccl = braid::bench::NcclLibrary::load(options.nccl_lib);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "braid-bench: %s\n", error.what());
      return 1;
    }
  }

  if (std::getenv("BRAID_RANK") != nullptr) {  // under braid-run: this process is one rank
    try {
      return run_rank(braid::Rendezvous::from_env(), options, nccl);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "braid-bench: %s\n", error.what());
      return 1;
    }
  }
  return run_threads(options, nccl);
}

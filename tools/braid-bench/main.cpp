// braid-bench. Until braid's collectives exist, it runs the symmetric-memory smoke run across all local
// GPUs: every rank writes a fresh random pattern into each peer's buffer through peer pointers and through
// the contiguous view, every rank checks what it received, and rank 0 prints one row per check.
//   braid-bench [-t N] [-b MIN] [-e MAX] [-f FACTOR]    ranks as threads (default: every visible GPU)
//   braid-run -n N braid-bench [...]                    ranks as processes
#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "braid/braid.hpp"
#include "peer_check.hpp"

namespace {

struct Options {
  int threads = 0;
  size_t min_bytes = 1;
  size_t max_bytes = size_t(64) << 20;
  size_t factor = 64;
  double timeout_s = 60;
};

// Runs every check on one rank; returns the number of wrong bytes seen by all ranks together.
uint64_t smoke_run(braid::Communicator& comm, const Options& options) {
  using braid::check::Route;
  if (comm.rank() == 0) {
    std::printf("# braid-bench symmetric-memory smoke run: %d ranks\n%s", comm.size(), comm.describe().c_str());
    std::printf("# every rank writes a fresh random pattern into its region of every peer's buffer; every rank checks\n");
    std::printf("# the regions it received (poisoned first). wrong = bytes wrong summed over all ranks.\n");
    std::printf("%14s  %-16s  %6s  %10s  %s\n", "region_bytes", "route", "ranks", "wrong", "result");
  }
  uint64_t wrong_total = 0;
  for (size_t region = options.min_bytes; region <= options.max_bytes; region *= options.factor) {
    for (Route route : {Route::kPeerPointer, Route::kContiguousView}) {
      for (size_t bytes : {region, region + 3}) {  // aligned and odd sizes
        braid::check::PeerWriteReport report = braid::check::peers_write_owners_check(comm, bytes, route);
        std::fputs(report.describe_failures(comm.rank()).c_str(), stderr);
        std::vector<uint64_t> wrong = braid::check::exchange_through_peers(comm, report.wrong_bytes());
        uint64_t sum = 0;
        for (uint64_t w : wrong) sum += w;
        wrong_total += sum;
        if (comm.rank() == 0) {
          std::printf("%14zu  %-16s  %6d  %10llu  %s\n", bytes, braid::check::route_name(route), comm.size(),
                      static_cast<unsigned long long>(sum), sum == 0 ? "ok" : "WRONG");
          std::fflush(stdout);
        }
      }
    }
    if (options.factor < 2) break;
  }
  if (comm.rank() == 0) {
    std::printf("# %s\n", wrong_total == 0 ? "smoke run passed: every byte arrived at every owner"
                                           : "smoke run FAILED: some bytes did not arrive");
  }
  return wrong_total;
}

int run_rank(const braid::Rendezvous& rendezvous, const Options& options) {
  try {
    braid::CommOptions comm_options;
    comm_options.timeout_s = options.timeout_s;
    braid::Communicator comm = braid::Communicator::init(rendezvous, comm_options);
    return smoke_run(comm, options) == 0 ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "braid-bench: rank %d: %s\n", rendezvous.rank, error.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"braid-bench: symmetric-memory smoke run across all local GPUs (collective benchmarks come next)"};
  app.add_option("-t,--threads", options.threads, "ranks as threads of this process (default: every visible GPU)");
  app.add_option("-b,--minbytes", options.min_bytes, "smallest region per peer, bytes")->check(CLI::PositiveNumber);
  app.add_option("-e,--maxbytes", options.max_bytes, "largest region per peer, bytes")->check(CLI::PositiveNumber);
  app.add_option("-f,--stepfactor", options.factor, "multiply the region by this between rows")->check(CLI::PositiveNumber);
  app.add_option("--timeout-s", options.timeout_s, "bound on every wait for a peer")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  if (std::getenv("BRAID_RANK") != nullptr) {  // under braid-run: this process is one rank
    try {
      return run_rank(braid::Rendezvous::from_env(), options);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "braid-bench: %s\n", error.what());
      return 1;
    }
  }
  int gpus = 0;
  cudaError_t result = cudaGetDeviceCount(&gpus);
  if (result != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "braid-bench: no CUDA device on this machine (%s)\n",
                 result == cudaSuccess ? "device count is 0" : cudaGetErrorName(result));
    return 1;
  }
  const int world = options.threads > 0 ? options.threads : gpus;
  braid::StoreHost store;
  std::vector<int> codes(world, 0);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] { codes[rank] = run_rank(braid::Rendezvous::at_store(store.address(), rank, world, false), options); });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int code : codes) {
    if (code != 0) return code;
  }
  return 0;
}

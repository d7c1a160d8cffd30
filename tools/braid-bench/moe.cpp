// braid-bench --moe on one rank (moe.hpp): MoeBench's run (its checks of the options, the seed every rank shares,
// the NCCL communicator, -N cycles over --tokens, the closing line) and moe_run.
#include "moe.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_objects.hpp"
#include "moe_bench.hpp"

namespace braid::bench {
namespace moe {

uint64_t MoeBench::run() {
  validate();
  cuda(cudaSetDevice(comm_.device()), "cudaSetDevice");
  stream_ = std::make_unique<StreamHandle>();
  share_seed();
  if (library_) {
    if (!library_->has_send_recv()) {
      throw std::runtime_error("--compare nccl: " + library_->path() + " has no ncclSend/ncclRecv (NCCL 2.7+): the "
                               "MoE baseline needs them");
    }
    nccl_ = std::make_unique<NcclComm>(library_, comm_);
  }
  header();
  for (int cycle = 0; options_.run_cycles == 0 || cycle < options_.run_cycles; ++cycle) {  // -N
    for (size_t tokens : options_.moe_tokens) run_tokens(tokens);
  }
  cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  comm_.barrier();
  if (rank_ == 0) {  // nccl-tests' closing line (#wrong summed over every row, braid's and NCCL's)
    std::printf("# Out of bounds values : %llu %s\n#\n", static_cast<unsigned long long>(wrong_total_),
                wrong_total_ == 0 ? "OK" : "FAILED");
  }
  if (rank_ == 0 && !options_.json_path.empty()) write_json();
  return wrong_total_;
}

void MoeBench::validate() const {
  if (options_.moe_experts % ranks_ != 0) {
    throw std::invalid_argument("--experts " + std::to_string(options_.moe_experts) + " is not a multiple of the " +
                                std::to_string(ranks_) + " ranks");
  }
  if (ranks_ > 64) throw std::invalid_argument("--moe runs on at most 64 ranks");
}

void MoeBench::share_seed() {
  uint64_t mine = options_.moe_seed;
  if (rank_ == 0 && mine == 0) {
    std::random_device entropy;
    mine = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  }
  std::vector<std::string> seeds = comm_.host_allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
  std::memcpy(&seed_, seeds[0].data(), sizeof(seed_));
}

}  // namespace moe

uint64_t moe_run(Communicator& comm, const Options& options, const std::shared_ptr<NcclLibrary>& nccl) {
  return moe::MoeBench(comm, options, nccl).run();
}

}  // namespace braid::bench

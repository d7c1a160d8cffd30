// All-gather, staged: every rank copies its input into staging; after a barrier, every rank's staging into its
// output (rank q's block at q × launch.rank_stride). launch.count: bytes.
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_staged(StagedLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank;
  run_staged<uint8_t>(
      launch,
      [&](const StagingView& staging, const Slice& slice) { copy_slice_in<uint8_t>(launch, staging, slice); },
      [&](const StagingView& staging, const Slice& slice) {
        for (int step = 0; step < world; ++step) {
          const int q = (rank + step) % world;  // rotated: spreads the links' load
          block_copy(launch.recv + q * launch.rank_stride + slice.begin, staging.of(launch, q) + slice.begin,
                     slice.end - slice.begin);
        }
      });
}

}  // namespace

void launch_all_gather_staged(const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather_staged, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

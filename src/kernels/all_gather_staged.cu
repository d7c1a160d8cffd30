// All-gather, staged: every rank copies its input into staging; after one barrier every rank copies every peer's
// staging into its slot of the output (loads over NVLink). Datatype-blind: moves bytes.
//
// launch.send/recv point at the chunk's start (recv inside rank block 0); rank q's block is
// launch.rank_stride bytes further per q. launch.count is in bytes.
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
          const int q = (rank + step) % world;  // start with a different peer on every rank: spread the links' load
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

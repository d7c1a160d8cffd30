// Broadcast: the root copies its input into staging; after one barrier every rank copies the root's staging
// into its output (the root too, unless in place). Datatype-blind: launch.count is in bytes.
#include "collectives/dependent_launch.cuh"
#include "collectives/kernels.hpp"
#include "collectives/staged.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) broadcast(StagedLaunch launch) {
  start_dependent_kernel();
  run_staged<uint8_t>(
      launch,
      [&](const StagingView& staging, const Slice& slice) {
        if (launch.pad.rank == launch.root) copy_slice_in<uint8_t>(launch, staging, slice);
      },
      [&](const StagingView& staging, const Slice& slice) {
        block_copy(launch.recv + slice.begin, staging.of(launch, launch.root) + slice.begin, slice.end - slice.begin);
      });
}

}  // namespace

void launch_broadcast(const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(broadcast, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

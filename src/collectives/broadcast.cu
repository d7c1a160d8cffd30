// Broadcast: the root copies its input into staging; after one barrier every rank copies the root's staging
// into its output (the root too, unless in place). Datatype-blind: launch.count is in bytes.
#include "collectives/kernels.hpp"
#include "collectives/staged.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) broadcast(StagedLaunch launch) {
  const int rank = launch.pad.rank, channel = blockIdx.x;
  const StagingView staging = staging_view(launch);
  const Slice slice = block_slice<uint8_t>(launch.count, blockIdx.x, gridDim.x);
  const size_t bytes = slice.end - slice.begin;
  if (rank == launch.root) block_copy(staging.of(launch, rank) + slice.begin, launch.send + slice.begin, bytes);
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  block_copy(launch.recv + slice.begin, staging.of(launch, launch.root) + slice.begin, bytes);
  finish_launch(launch);
}

}  // namespace

void launch_broadcast(const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  broadcast<<<blocks, kThreadsPerBlock, 0, stream>>>(launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

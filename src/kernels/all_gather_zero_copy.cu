// All-gather into outputs every peer maps: rank r stores its input into block r of each. Entry barrier: every
// peer's output may be written; exit: every peer's stores into this output have landed.
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged_launch.hpp"
#include "kernels/zero_copy_bodies.cuh"
#include "kernels/zero_copy_launch.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_zero_copy(ZeroCopyLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  all_gather_stores(launch.recv_peers.at, launch.local_send, launch.count, launch.rank_stride, world, rank);
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

}  // namespace

void launch_all_gather_zero_copy(const ZeroCopyLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather_zero_copy, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

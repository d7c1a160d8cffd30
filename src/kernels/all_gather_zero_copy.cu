// All-gather into outputs every peer maps: rank r stores its input into block r of each. Entry barrier: every
// peer's output may be written; exit: every peer's stores into this output have landed.
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged_launch.hpp"
#include "kernels/zero_copy_launch.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_zero_copy(ZeroCopyLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  const Slice part = block_slice<uint8_t>(launch.count, blockIdx.x, gridDim.x);  // bytes of one rank
  const char* source = launch.local_send + part.begin;
  char* destinations[kMaxWorld];
  int count = 0;
  for (int k = 0; k < world; ++k) {
    char* to = launch.recv_peers.at[(rank + k) % world] + rank * launch.rank_stride + part.begin;  // rotated
    if (to != source) destinations[count++] = to;  // in place
  }
  block_copy_to(destinations, count, source, part.end - part.begin);
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

}  // namespace

void launch_all_gather_zero_copy(const ZeroCopyLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather_zero_copy, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

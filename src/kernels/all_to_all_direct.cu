// All-to-all on buffers the peers map, between an entry barrier (every peer's input written, output free) and an
// exit barrier (every peer done with this rank's buffers): stores into every recv, or loads from every send (for
// another GPU's cudaMalloc memory of this process, which copy engines must not read).
#include "kernels/all_to_all_launch.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/zero_copy_bodies.cuh"
#include "kernels/kernels.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_to_all_direct(AllToAllDirectLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  all_to_all_copies(launch.recv.at, launch.send.at, launch.block_bytes, world, rank, launch.loads);
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

__global__ void barrier_kernel(device::SignalPad pad, unsigned int collective, unsigned int site, uint64_t plan) {
  start_dependent_kernel();
  device::barrier(pad, 0, collective, site, plan);
}

}  // namespace

void launch_all_to_all_direct(const AllToAllDirectLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_to_all_direct, blocks, kThreadsPerBlock, stream, launch);
}

void launch_barrier(const device::SignalPad& pad, unsigned int collective, unsigned int site, uint64_t plan,
                    cudaStream_t stream) {
  launch_dependent(barrier_kernel, 1, 32, stream, pad, collective, site, plan);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

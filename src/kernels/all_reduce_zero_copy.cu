// All-reduce, two shot, on symmetric buffers: rank r reduces shard r from every peer's input into its output and
// every peer's. Entry barrier: every peer's input is written; exit: every peer is done with this rank's buffers.
// In place is safe: only rank r touches shard r, and a block loads its whole part before storing any of it.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged_launch.hpp"
#include "kernels/zero_copy_bodies.cuh"
#include "kernels/zero_copy_launch.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_two_shot_zero_copy(ZeroCopyLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  all_reduce_two_shot_stores<T, Op>(launch.send.at, launch.recv, launch.recv_peers.at, launch.count, world, rank);
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

}  // namespace

void launch_all_reduce_two_shot_zero_copy(DataType type, ReduceOp op, const ZeroCopyLaunch& launch, int blocks,
                                          cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_two_shot_zero_copy, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

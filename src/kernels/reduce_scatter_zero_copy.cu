// Reduce-scatter on send buffers every peer maps: rank r reduces block r of each straight into its output. Exit
// barrier: every peer has read this rank's input before its stream may overwrite it. In place is safe.
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
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_scatter_zero_copy(ZeroCopyLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  reduce_scatter_loads<T, Op>(launch.send.at, launch.recv, launch.count, launch.rank_stride, world, rank);
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

}  // namespace

void launch_reduce_scatter_zero_copy(DataType type, ReduceOp op, const ZeroCopyLaunch& launch, int blocks,
                                     cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_scatter_zero_copy, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

// Reduce-scatter on a send buffer that every peer has mapped (symmetric allocation or registered buffer): rank
// r reduces block r of every rank's send buffer straight into its own output, with no staging copy and no
// FIFO. The output may be any buffer. Two barriers per call, on the block's own channel with the same block of
// every peer: entry (every peer's input is written before anyone reads it) and exit (every peer has finished
// reading this rank's input before its stream goes on and may overwrite it).
//
// Block q of rank r's input is read by rank q alone, so in place (output = block r of the input) is safe: the
// thread that stores an element has loaded it first. Reduction is in rank order, as everywhere. The traffic is
// NVLink loads only, (world-1)/world of the input a rank; the same loop outside braid is
// bench/probes/allreduce_paths.cu's rs-loads.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged_launch.hpp"
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
  const char* sources[kMaxWorld];
  for (int r = 0; r < world; ++r) sources[r] = launch.send.at[r] + rank * launch.rank_stride;
  char* destination = launch.recv;
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &destination, 1, block_slice<T>(launch.count, blockIdx.x, gridDim.x),
                                     0, 0, world);
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

}  // namespace

void launch_reduce_scatter_zero_copy(DataType type, ReduceOp op, const ZeroCopyLaunch& launch, int blocks,
                                     cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_scatter_zero_copy, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

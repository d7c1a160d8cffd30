// Reduce-scatter, staged (staged.cuh). launch.send: the chunk in rank block 0; block q lies q × rank_stride
// elements on, and at q × block_bytes in staging.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_scatter_staged(StagedLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank;
  const size_t block_bytes = (launch.count * sizeof(T) + 255) / 256 * 256;
  run_staged<T>(
      launch,
      [&](const StagingView& staging, const Slice& slice) {
        for (int q = 0; q < world; ++q) {
          block_copy(staging.of(launch, rank) + q * block_bytes + slice.begin * sizeof(T),
                     launch.send + (q * launch.rank_stride + slice.begin) * sizeof(T),
                     (slice.end - slice.begin) * sizeof(T));
        }
      },
      [&](const StagingView& staging, const Slice& slice) {
        reduce_staging<T, Op>(launch, staging, rank * block_bytes, slice, launch.recv);
      });
}

}  // namespace

void launch_reduce_scatter_staged(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_scatter_staged, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

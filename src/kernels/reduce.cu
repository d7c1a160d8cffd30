// Reduce to a root, staged (staged.cuh). Split (3+ ranks): rank r first reduces part r of each slice into its own
// staging, then the root gathers the parts. Only the root's output is written.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_to_root(StagedLaunch launch) {
  start_dependent_kernel();
  run_staged<T>(
      launch,
      [&](const StagingView& staging, const Slice& slice) { copy_slice_in<T>(launch, staging, slice); },
      [&](const StagingView& staging, const Slice& slice) {
        if (launch.pad.rank == launch.root) reduce_staging<T, Op>(launch, staging, 0, slice, launch.recv);
      });
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_split(StagedLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank;
  run_staged_split<T>(
      launch, [&](const StagingView& staging, const Slice& slice) { copy_slice_in<T>(launch, staging, slice); },
      [&](const StagingView& staging, const Slice& slice) {
        reduce_staging<T, Op>(launch, staging, 0, slice_part<T>(slice, rank, world), staging.of(launch, rank));
      },
      [&](const StagingView& staging, const Slice& slice) {
        if (rank != launch.root) return;
        for (int q = 0; q < world; ++q) {
          const Slice part = slice_part<T>(slice, q, world);
          block_copy(launch.recv + part.begin * sizeof(T), staging.of(launch, q) + part.begin * sizeof(T),
                     (part.end - part.begin) * sizeof(T));
        }
      });
}

}  // namespace

void launch_reduce(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_to_root, type, op, blocks, stream, launch);
}

void launch_reduce_split(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_split, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

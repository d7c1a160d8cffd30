// All-reduce, one shot: every rank copies its input into its staging; after one barrier every rank reduces all
// ranks' staging in rank order (identical results on every rank).
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_one_shot(StagedLaunch launch) {
  start_dependent_kernel();
  run_staged<T>(
      launch,
      [&](const StagingView& staging, const Slice& slice) { copy_slice_in<T>(launch, staging, slice); },
      [&](const StagingView& staging, const Slice& slice) {
        reduce_staging<T, Op>(launch, staging, 0, slice, launch.recv);
      });
}

}  // namespace

void launch_all_reduce_one_shot(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_one_shot, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

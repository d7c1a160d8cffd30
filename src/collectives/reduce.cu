// Reduce to a root: every rank copies its input into staging; after one barrier the root reads every peer's
// staging and reduces into its output. The other ranks' outputs are not touched.
#include "collectives/dependent_launch.cuh"
#include "collectives/dispatch.cuh"
#include "collectives/kernels.hpp"
#include "collectives/staged.cuh"
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

}  // namespace

void launch_reduce(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_to_root, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

// Broadcast, staged: the root copies its input into staging; after one barrier every rank copies it out. Split
// (three ranks or more): after the first barrier rank r copies part r from the root's staging into its own
// staging and output; after the second, every rank copies part q from rank q's staging. launch.count: bytes.
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) broadcast(StagedLaunch launch) {
  start_dependent_kernel();
  run_staged<uint8_t>(
      launch,
      [&](const StagingView& staging, const Slice& slice) {
        if (launch.pad.rank == launch.root) copy_slice_in<uint8_t>(launch, staging, slice);
      },
      [&](const StagingView& staging, const Slice& slice) {
        block_copy(launch.recv + slice.begin, staging.of(launch, launch.root) + slice.begin, slice.end - slice.begin);
      });
}

__global__ void __launch_bounds__(kThreadsPerBlock) broadcast_split(StagedLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, root = launch.root;
  run_staged_split<uint8_t>(
      launch,
      [&](const StagingView& staging, const Slice& slice) {
        if (rank == root) copy_slice_in<uint8_t>(launch, staging, slice);
      },
      [&](const StagingView& staging, const Slice& slice) {
        if (rank == root) {  // its own output
          block_copy(launch.recv + slice.begin, staging.of(launch, root) + slice.begin, slice.end - slice.begin);
          return;
        }
        const Slice part = slice_part<uint8_t>(slice, rank, world);
        char* destinations[2] = {staging.of(launch, rank) + part.begin, launch.recv + part.begin};
        block_copy_to(destinations, 2, staging.of(launch, root) + part.begin, part.end - part.begin);
      },
      [&](const StagingView& staging, const Slice& slice) {
        if (rank == root) return;
        for (int q = 0; q < world; ++q) {
          if (q == rank) continue;
          const Slice part = slice_part<uint8_t>(slice, q, world);
          block_copy(launch.recv + part.begin, staging.of(launch, q) + part.begin, part.end - part.begin);
        }
      });
}

}  // namespace

void launch_broadcast(const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(broadcast, blocks, kThreadsPerBlock, stream, launch);
}

void launch_broadcast_split(const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(broadcast_split, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

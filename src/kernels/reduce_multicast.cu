// Reduce to a root through NVLink multicast (multimem.ld_reduce after the entry barrier). No exit barrier: a rank
// rewrites this half only after the next entry barrier (staged.cuh). Behind BRAID_ENABLE_MULTICAST only.
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/multicast.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_multicast(MulticastLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) {  // NOTE [stopped ranks]: no write to the region; the barrier answers
    device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteEntryBarrier, launch.plan);
    return;
  }
  const int channel = blockIdx.x;
  const size_t half = multicast_half(launch);
  const Slice slice = block_slice<T>(launch.count, blockIdx.x, gridDim.x);  // whole vectors
  const size_t begin = slice.begin * sizeof(T), bytes = (slice.end - slice.begin) * sizeof(T);
  block_copy(launch.local + half + begin, launch.send + begin, bytes);
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  if (launch.pad.rank == launch.root) {
    const char* const multicast = launch.multicast + half + begin;
    for (size_t v = threadIdx.x; v < bytes / 16; v += blockDim.x) {
      store_vector(launch.recv + begin + v * 16, device::multimem_load_reduce<T, Op>(multicast + v * 16));
    }
  }
  finish_multicast(launch);
}

}  // namespace

void launch_reduce_multicast(DataType type, ReduceOp op, const MulticastLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_MULTIMEM(reduce_multicast, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

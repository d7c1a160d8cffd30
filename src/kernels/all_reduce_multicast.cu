// All-reduce through NVLink multicast: every rank copies its input into its copy of the region; after a barrier
// each rank reduces its share with multimem.ld_reduce and multimem-stores the sum into every copy; after a
// second barrier each rank copies the result out. Only behind BRAID_ENABLE_MULTICAST, never on a shared host.
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/multicast.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_multicast(MulticastLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) {  // NOTE [stopped ranks]: no write to the region; the barrier answers
    device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteEntryBarrier, launch.plan);
    return;
  }
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  const size_t half = multicast_half(launch);
  char* const local = launch.local + half;
  char* const multicast = launch.multicast + half;
  const Slice slice = block_slice<T>(launch.count, blockIdx.x, gridDim.x);  // whole vectors: count * size % 16 == 0
  const size_t begin = slice.begin * sizeof(T), bytes = (slice.end - slice.begin) * sizeof(T);
  block_copy(local + begin, launch.send + begin, bytes);
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  const Share share = rank_share(bytes / 16, rank, world);
  for (size_t v = share.first + threadIdx.x; v < share.end; v += blockDim.x) {
    char* const at = multicast + begin + v * 16;
    device::multimem_store(at, device::multimem_load_reduce<T, Op>(at));
  }
  __threadfence_system();  // the multicast stores, before the barrier's release
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteMiddleBarrier, launch.plan)) return;
  block_copy(launch.recv + begin, local + begin, bytes);
  finish_multicast(launch);
}

}  // namespace

void launch_all_reduce_multicast(DataType type, ReduceOp op, const MulticastLaunch& launch, int blocks,
                                 cudaStream_t stream) {
  BRAID_LAUNCH_MULTIMEM(all_reduce_multicast, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

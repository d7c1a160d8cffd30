// All-gather through NVLink multicast: every rank multimem-stores its block into every rank's copy of the region;
// after a barrier each rank copies every block out. Only behind BRAID_ENABLE_MULTICAST, never on a shared host.
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/multicast.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_multicast(MulticastLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) {  // NOTE [stopped ranks]: no write to the region; the barrier answers
    device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteEntryBarrier, launch.plan);
    return;
  }
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  const size_t half = multicast_half(launch);
  const size_t block = launch.count;  // bytes of each rank's block, whole vectors
  const Slice slice = block_slice<uint8_t>(block, blockIdx.x, gridDim.x);
  const size_t begin = slice.begin, bytes = slice.end - slice.begin;
  char* const multicast = launch.multicast + half + rank * block + begin;
  for (size_t v = threadIdx.x; v < bytes / 16; v += blockDim.x) {
    device::multimem_store(multicast + v * 16, load_vector(launch.send + begin + v * 16));
  }
  __threadfence_system();  // the multicast stores, before the barrier's release
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  for (int q = 0; q < world; ++q) {
    block_copy(launch.recv + q * launch.rank_stride + begin, launch.local + half + q * block + begin, bytes);
  }
  finish_multicast(launch);
}

}  // namespace

void launch_all_gather_multicast(const MulticastLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather_multicast, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

// All-gather into an output that every peer has mapped (symmetric allocation or registered buffer): rank r
// stores its input straight into block r of every rank's output, with no staging copy and no FIFO. The input
// may be any buffer. Two barriers per call, on the block's own channel with the same block of every peer:
// entry (every peer's stream reached this call, so its output may be written) and exit (every peer's stores
// into this rank's output have landed before its stream goes on).
//
// Block r of any output is written by rank r alone; in place (input = block r of its own output) skips that
// copy. Each block stores its part to the peers in rotated order (rank + 1 first), one source read once for
// every destination. The traffic is NVLink stores only; the same loop outside braid is
// bench/probes/allreduce_paths.cu's ag-stores.
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged_launch.hpp"
#include "kernels/zero_copy_launch.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_zero_copy(ZeroCopyLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  const Slice part = block_slice<uint8_t>(launch.count, blockIdx.x, gridDim.x);  // count: bytes of one rank
  const char* source = launch.local_send + part.begin;
  char* destinations[kMaxWorld];
  int count = 0;
  for (int k = 0; k < world; ++k) {
    char* to = launch.recv_peers.at[(rank + k) % world] + rank * launch.rank_stride + part.begin;
    if (to != source) destinations[count++] = to;
  }
  block_copy_to(destinations, count, source, part.end - part.begin);
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

}  // namespace

void launch_all_gather_zero_copy(const ZeroCopyLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather_zero_copy, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

// All-to-all on buffers the peers map (zero copy), three ways, each between an entry and an exit barrier:
//   - stores: every block stores its slice of each of this rank's blocks straight into the receiver's output
//     (recv), so no byte goes through staging;
//   - loads: every block loads its slice of block rank() of each peer's input (send) into this rank's output:
//     the one-sided all-to-all on global memory where a peer's range is another GPU's cudaMalloc memory of this
//     process, which copy engines must not read (PeerRange::same_process_peers);
//   - copy engines: the host side (all_to_all.cpp) enqueues cudaMemcpyAsync pulls from the peers' inputs
//     between two one-block barrier kernels (launch_barrier), so no kernel is on the data path.
// The entry barrier: every peer reached this call (its input is written, its output is no longer in use).
// The exit barrier: every peer finished writing into (stores) or reading from (copies) this rank's buffers
// before this rank's stream goes on and may reuse them.
#include "kernels/all_to_all_launch.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_to_all_direct(AllToAllDirectLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  const Slice part = block_slice<uint8_t>(launch.block_bytes, blockIdx.x, gridDim.x);
  for (int step = 0; step < world; ++step) {
    const int q = (rank + step) % world;  // a different first peer on every rank: spread the links' load
    // Block (from, to): rank `from`'s block for rank `to`, at to × block_bytes of from's send and at
    // from × block_bytes of to's recv.
    const int from = launch.loads ? q : rank, to = launch.loads ? rank : q;
    block_copy(launch.recv.at[to] + from * launch.block_bytes + part.begin,
               launch.send.at[from] + to * launch.block_bytes + part.begin, part.end - part.begin);
  }
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

// One block: a barrier of signal channel 0 with every peer, announcing `plan`.
__global__ void barrier_kernel(device::SignalPad pad, unsigned int collective, unsigned int site, uint64_t plan) {
  start_dependent_kernel();
  device::barrier(pad, 0, collective, site, plan);
}

}  // namespace

void launch_all_to_all_direct(const AllToAllDirectLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_to_all_direct, blocks, kThreadsPerBlock, stream, launch);
}

void launch_barrier(const device::SignalPad& pad, unsigned int collective, unsigned int site, uint64_t plan,
                    cudaStream_t stream) {
  launch_dependent(barrier_kernel, 1, 32, stream, pad, collective, site, plan);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

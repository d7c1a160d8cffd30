// All-reduce, two shot, on symmetric buffers: rank r reduces shard r from every peer's input into its output and
// every peer's. Entry barrier: every peer's input is written; exit: every peer is done with this rank's buffers.
// In place is safe: only rank r touches shard r, and a block loads its whole part before storing any of it.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/staged_launch.hpp"
#include "kernels/zero_copy_launch.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_two_shot_zero_copy(ZeroCopyLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier, launch.plan)) return;
  const char* sources[kMaxWorld];
  for (int r = 0; r < world; ++r) sources[r] = launch.send.at[r];
  const Slice shard = block_slice<T>(launch.count, rank, world);
  Slice part = block_slice<T>(shard.end - shard.begin, blockIdx.x, gridDim.x);
  part.begin += shard.begin;
  part.vector_end += shard.begin;
  part.end += shard.begin;
  char* own = launch.recv;
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &own, 1, part, 0, 0, world);
  // All loads done before any peer's output (maybe its input) is overwritten; the sums visible.
  __syncthreads();
  char* peers[kMaxWorld];
  int peer_count = 0;
  for (int k = 1; k < world; ++k) peers[peer_count++] = launch.recv_peers.at[(rank + k) % world] + part.begin * sizeof(T);
  block_copy_to(peers, peer_count, launch.recv + part.begin * sizeof(T), (part.end - part.begin) * sizeof(T));
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

}  // namespace

void launch_all_reduce_two_shot_zero_copy(DataType type, ReduceOp op, const ZeroCopyLaunch& launch, int blocks,
                                          cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_two_shot_zero_copy, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

// All-reduce on buffers in symmetric memory (zero copy): the two shot reads and writes the peers' own buffers
// over NVLink, so no byte goes through staging. Two barriers per call, both on the block's own channel with the
// same block of every peer:
//   - entry: every peer's input is written (its stream reached this call) before anyone reads it;
//   - exit: every peer has finished reading this rank's input and writing its output before this rank's stream
//     goes on and may overwrite either. A kernel ends only after all its blocks passed their exit barriers, so
//     the whole buffer is covered.
// Rank r reduces shard r from every peer's input into its own output, then stores the result into every peer's
// output. Shard r of any rank is touched by rank r alone, and a block loads its whole part before it stores any
// of it into a peer, so in place is safe. Reduction is in rank order everywhere, so every rank gets bit-identical
// results.
//
// The two shot keeps its halves apart in each block (all of its part's loads, then all of its stores) rather
// than storing each reduced vector to every peer as it goes: mixed, each thread's stores wait behind its loads'
// NVLink round trips (bench/probes/allreduce_paths.cu compares the two).
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
  // This rank's shard (whole vectors, the scalar tail with the last shard), then this block's part of it.
  const Slice shard = block_slice<T>(launch.count, rank, world);
  Slice part = block_slice<T>(shard.end - shard.begin, blockIdx.x, gridDim.x);
  part.begin += shard.begin;
  part.vector_end += shard.begin;
  part.end += shard.begin;
  char* own = launch.recv;
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &own, 1, part, 0, 0, world);
  // Every thread's loads of the part are done (their sums are stored) before any thread overwrites a peer's
  // output, which may be that peer's input; and the whole reduced part is visible to the block.
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

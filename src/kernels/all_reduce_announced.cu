// All-reduce of an eager call that announces its input and output (announced.cuh). launch.staged.count: elements.
// Every rank's buffers exposed: two shot, rank r reduces shard r of every input into its output and every peer's,
// then an exit barrier (every peer is done with this rank's buffers); a block loads its whole part before it
// stores any, so in place is safe. Any rank's not: every rank stages, in rounds of a staging half, and each
// reduces the whole round from every half (NOTE [announced staged rounds]).
#include "core/kernel_modules.hpp"
#include "kernels/announced.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__device__ void all_reduce_staged_rounds(const StagedLaunch& launch, uint64_t counter) {
  const int world = launch.pad.world, rank = launch.pad.rank;
  const size_t chunk = launch.half_bytes / 256 * 256 / sizeof(T);
  const size_t rounds = (launch.count + chunk - 1) / chunk;
  Slice slice{};
  size_t first = 0;
  const auto part = [&](size_t round) {
    first = round * chunk;
    slice = block_slice<T>(launch.count - first < chunk ? launch.count - first : chunk, blockIdx.x, gridDim.x);
  };
  run_staged_rounds(
      launch, counter, rounds,
      [&](size_t round, size_t half) {
        part(round);
        block_copy(launch.staging[rank] + half + slice.begin * sizeof(T),
                   launch.send + (first + slice.begin) * sizeof(T), (slice.end - slice.begin) * sizeof(T));
      },
      [&](size_t, size_t half) {
        const char* sources[kMaxWorld];
        for (int r = 0; r < world; ++r) sources[r] = launch.staging[r] + half;
        char* destination = launch.recv + first * sizeof(T);
        block_reduce<T, Op, kLoadBatch<T>>(sources, world, &destination, 1, slice, 0, 0, world);
      });
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_announced(AnnouncedLaunch launch) {
  start_dependent_kernel();
  const StagedLaunch& call = launch.staged;
  __shared__ char* buffers[kAnnouncedBuffers][kMaxWorld];
  char* const own[kAnnouncedBuffers] = {const_cast<char*>(call.send), call.recv};
  const AnnouncedEntry entry = enter_announced(launch, buffers, own);
  if (entry.path == AnnouncedPath::kEnd) return;
  if (entry.path == AnnouncedPath::kStaged) {
    all_reduce_staged_rounds<T, Op>(call, entry.counter);
    return;
  }
  const int world = call.pad.world, rank = call.pad.rank;
  const char* sources[kMaxWorld];
  for (int r = 0; r < world; ++r) sources[r] = buffers[0][r];
  const Slice shard = block_slice<T>(call.count, rank, world);
  Slice part = block_slice<T>(shard.end - shard.begin, blockIdx.x, gridDim.x);
  part.begin += shard.begin;
  part.vector_end += shard.begin;
  part.end += shard.begin;
  char* own_output = call.recv;
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &own_output, 1, part, 0, 0, world);
  __syncthreads();  // all loads done before any peer's output (maybe its input) is overwritten; the sums visible
  char* peers[kMaxWorld];
  int peer_count = 0;
  for (int k = 1; k < world; ++k) peers[peer_count++] = buffers[1][(rank + k) % world] + part.begin * sizeof(T);
  block_copy_to(peers, peer_count, call.recv + part.begin * sizeof(T), (part.end - part.begin) * sizeof(T));
  device::barrier(call.pad, blockIdx.x, call.collective, kSiteExitBarrier, call.plan);
}

}  // namespace

void launch_all_reduce_announced(DataType type, ReduceOp op, const AnnouncedLaunch& launch, int blocks,
                                 cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_announced, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

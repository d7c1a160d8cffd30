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
#include "kernels/zero_copy_bodies.cuh"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_announced(AnnouncedLaunch launch) {
  start_dependent_kernel();
  const StagedLaunch& call = launch.staged;
  const int world = call.pad.world, rank = call.pad.rank;
  __shared__ char* buffers[kAnnouncedBuffers][kMaxWorld];
  char* const own[kAnnouncedBuffers] = {const_cast<char*>(call.send), call.recv};
  // Staged: the round into this rank's half; every half reduced into the output.
  const StagedRounds<T> rounds(call, staged_chunk(call, 1, sizeof(T)));
  const auto copy_in = [&](size_t first, const Slice& slice, size_t half) {
    block_copy(call.staging[rank] + half + slice.begin * sizeof(T), call.send + (first + slice.begin) * sizeof(T),
               (slice.end - slice.begin) * sizeof(T));
  };
  const auto read_out = [&](size_t first, const Slice& slice, size_t half) {
    const char* sources[kMaxWorld];
    for (int r = 0; r < world; ++r) sources[r] = call.staging[r] + half;
    char* destination = call.recv + first * sizeof(T);
    block_reduce<T, Op, kLoadBatch<T>>(sources, world, &destination, 1, slice, 0, 0, world);
  };
  const bool staged = staged_here(launch, 3u);  // either buffer: staged whatever the peers announce
  const AnnouncedEntry entry = enter_announced(launch, buffers, own, [&](uint64_t counter) {
    if (staged) rounds.copy_first(counter, copy_in);
  });
  if (entry.path == AnnouncedPath::kEnd) return;
  if (entry.path == AnnouncedPath::kStaged) {
    rounds.run(entry.counter, staged, every_rank_staged(launch, buffers, 3u), copy_in, read_out);
    return;
  }
  all_reduce_two_shot_stores<T, Op>(buffers[0], call.recv, buffers[1], call.count, world, rank);
  device::barrier(call.pad, blockIdx.x, call.collective, kSiteExitBarrier, call.plan);
}

}  // namespace

void launch_all_reduce_announced(DataType type, ReduceOp op, const AnnouncedLaunch& launch, int blocks,
                                 cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_announced, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

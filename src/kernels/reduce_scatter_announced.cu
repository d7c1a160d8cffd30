// Reduce-scatter of an eager call that announces its input (announced.cuh). launch.staged.count: elements of the
// output; rank_stride: elements between the input's rank blocks. Every rank's input exposed: rank r reduces block r
// of each straight into its output (zero copy), then an exit barrier (every peer has read this rank's input).
// Any rank's not: every rank stages, in rounds of a staging half (NOTE [announced staged rounds]).
#include "core/kernel_modules.hpp"
#include "kernels/announced.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/zero_copy_bodies.cuh"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_scatter_announced(AnnouncedLaunch launch) {
  start_dependent_kernel();
  const StagedLaunch& call = launch.staged;
  const int world = call.pad.world, rank = call.pad.rank;
  __shared__ char* buffers[kAnnouncedBuffers][kMaxWorld];
  char* const own[kAnnouncedBuffers] = {const_cast<char*>(call.send), nullptr};
  // Staged: the round's part of every block of this rank's input into its half, a chunk apart; every rank's part
  // of block `rank` reduced into the output.
  const size_t chunk = staged_chunk(call, world, sizeof(T)), chunk_bytes = chunk * sizeof(T);
  const StagedRounds<T> rounds(call, chunk);
  const auto copy_in = [&](size_t first, const Slice& slice, size_t half) {
    for (int q = 0; q < world; ++q) {
      block_copy(call.staging[rank] + half + q * chunk_bytes + slice.begin * sizeof(T),
                 call.send + (q * call.rank_stride + first + slice.begin) * sizeof(T),
                 (slice.end - slice.begin) * sizeof(T));
    }
  };
  const auto read_out = [&](size_t first, const Slice& slice, size_t half) {
    const char* sources[kMaxWorld];
    for (int r = 0; r < world; ++r) sources[r] = call.staging[r] + half + rank * chunk_bytes;
    char* destination = call.recv + first * sizeof(T);
    block_reduce<T, Op, kLoadBatch<T>>(sources, world, &destination, 1, slice, 0, 0, world);
  };
  const bool staged = staged_here(launch, 1u);  // its input: staged whatever the peers announce
  const AnnouncedEntry entry = enter_announced(launch, buffers, own, [&](uint64_t counter) {
    if (staged) rounds.copy_first(counter, copy_in);
  });
  if (entry.path == AnnouncedPath::kEnd) return;
  if (entry.path == AnnouncedPath::kStaged) {
    rounds.run(entry.counter, staged, every_rank_staged(launch, buffers, 1u), copy_in, read_out);
    return;
  }
  reduce_scatter_loads<T, Op>(buffers[0], call.recv, call.count, call.rank_stride * sizeof(T), world, rank);
  device::barrier(call.pad, blockIdx.x, call.collective, kSiteExitBarrier, call.plan);
}

}  // namespace

void launch_reduce_scatter_announced(DataType type, ReduceOp op, const AnnouncedLaunch& launch, int blocks,
                                     cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_scatter_announced, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

// All-gather of an eager call that announces its output (announced.cuh). launch.staged.count: bytes of one rank's
// block. Every rank's output exposed: rank r stores its input into block r of each (zero copy), then an exit
// barrier. Any rank's not: every rank stages, in rounds of a staging half (NOTE [announced staged rounds]).
#include "core/kernel_modules.hpp"
#include "kernels/announced.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/zero_copy_bodies.cuh"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_announced(AnnouncedLaunch launch) {
  start_dependent_kernel();
  const StagedLaunch& call = launch.staged;
  const int world = call.pad.world, rank = call.pad.rank;
  __shared__ char* buffers[kAnnouncedBuffers][kMaxWorld];
  char* const own[kAnnouncedBuffers] = {call.recv, nullptr};
  // Staged: this rank's part of the round into its half; every half out.
  const StagedRounds<uint8_t> rounds(call, staged_chunk(call, 1, 1));
  const auto copy_in = [&](size_t first, const Slice& slice, size_t half) {
    block_copy(call.staging[rank] + half + slice.begin, call.send + first + slice.begin, slice.end - slice.begin);
  };
  const auto read_out = [&](size_t first, const Slice& slice, size_t half) {
    for (int step = 0; step < world; ++step) {
      const int q = (rank + step) % world;  // rotated: spreads the links' load
      char* to = call.recv + q * call.rank_stride + first + slice.begin;
      const char* from = q == rank ? call.send + first + slice.begin : call.staging[q] + half + slice.begin;
      if (to != from) block_copy(to, from, slice.end - slice.begin);  // in place: the own block is there
    }
  };
  const bool staged = staged_here(launch, 1u);  // its output: staged whatever the peers announce
  const AnnouncedEntry entry = enter_announced(launch, buffers, own, [&](uint64_t counter) {
    if (staged) rounds.copy_first(counter, copy_in);
  });
  if (entry.path == AnnouncedPath::kEnd) return;
  if (entry.path == AnnouncedPath::kStaged) {
    rounds.run(entry.counter, staged, every_rank_staged(launch, buffers, 1u), copy_in, read_out);
    return;
  }
  all_gather_stores(buffers[0], call.send, call.count, call.rank_stride, world, rank);
  device::barrier(call.pad, blockIdx.x, call.collective, kSiteExitBarrier, call.plan);
}

}  // namespace

void launch_all_gather_announced(const AnnouncedLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather_announced, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

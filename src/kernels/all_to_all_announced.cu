// All-to-all of an eager call that announces its output and its input (announced.cuh). launch.staged.count and
// rank_stride: bytes of one block. Every rank's output exposed and none in place: rank r stores its block q into
// block r of rank q's output (zero copy). Some rank in place and every buffer exposed: pair exchanges (NOTE
// [all-to-all pair exchanges]). Either ends with an exit barrier. Otherwise every rank stages, in rounds of a
// staging half (NOTE [announced staged rounds]).
#include "core/kernel_modules.hpp"
#include "kernels/announced.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/zero_copy_bodies.cuh"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_to_all_announced(AnnouncedLaunch launch) {
  start_dependent_kernel();
  const StagedLaunch& call = launch.staged;
  __shared__ char* buffers[kAnnouncedBuffers][kMaxWorld];
  char* const own[kAnnouncedBuffers] = {call.recv, const_cast<char*>(call.send)};
  const int world = call.pad.world, rank = call.pad.rank;
  // Staged: the round's part of every block of this rank's input into its half, a chunk apart; every rank's part
  // for this rank into the output's blocks.
  const size_t chunk = staged_chunk(call, world, 1);
  const StagedRounds<uint8_t> rounds(call, chunk);
  const auto copy_in = [&](size_t first, const Slice& slice, size_t half) {
    for (int q = 0; q < world; ++q) {
      block_copy(call.staging[rank] + half + q * chunk + slice.begin,
                 call.send + q * call.rank_stride + first + slice.begin, slice.end - slice.begin);
    }
  };
  const auto read_out = [&](size_t first, const Slice& slice, size_t half) {
    for (int step = 0; step < world; ++step) {
      const int q = (rank + step) % world;  // rotated: spreads the links' load
      block_copy(call.recv + q * call.rank_stride + first + slice.begin,
                 call.staging[q] + half + rank * chunk + slice.begin, slice.end - slice.begin);
    }
  };
  const bool staged = staged_here(launch, 1u);  // its output: both zero-copy paths need every output
  const AnnouncedEntry entry = enter_announced(launch, buffers, own, [&](uint64_t counter) {
    if (staged) rounds.copy_first(counter, copy_in);
  });
  if (entry.path == AnnouncedPath::kEnd) return;
  // The same on every rank: every rank's words decide it (a rank's own buffers count as exposed by its words).
  bool outputs = true, inputs = true, in_place = false;
  for (int q = 0; q < world; ++q) {
    const char* output = q != rank || launch.words[0] != kAnnouncedStaged ? buffers[0][q] : nullptr;
    const char* input = q != rank || launch.words[1] != kAnnouncedStaged ? buffers[1][q] : nullptr;
    outputs &= output != nullptr;
    inputs &= input != nullptr;
    in_place |= input != nullptr && input == output;
  }
  if (outputs && (inputs || !in_place)) {
    if (in_place) all_to_all_exchanges(buffers[0], buffers[1], call.count, world, rank);
    else all_to_all_copies(buffers[0], buffers[1], call.count, world, rank, false);
    device::barrier(call.pad, blockIdx.x, call.collective, kSiteExitBarrier, call.plan);
    return;
  }
  rounds.run(entry.counter, staged, every_rank_staged(launch, buffers, 1u), copy_in, read_out);
}

}  // namespace

void launch_all_to_all_announced(const AnnouncedLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_to_all_announced, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

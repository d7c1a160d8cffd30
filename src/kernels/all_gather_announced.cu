// All-gather of an eager call that announces its output (announced.cuh). launch.staged.count: bytes of one rank's
// block. Every rank's output exposed: rank r stores its input into block r of each (zero copy), then an exit
// barrier. Any rank's not: every rank stages, in rounds of a staging half (NOTE [announced staged rounds]).
#include "core/kernel_modules.hpp"
#include "kernels/announced.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"

namespace braid::kernels {
namespace {

// Round by round: this rank's part of the round into its half; every rank's half into the output.
__device__ void gather_staged(const StagedLaunch& launch, uint64_t counter) {
  const int world = launch.pad.world, rank = launch.pad.rank;
  const size_t rounds = (launch.count + launch.half_bytes - 1) / launch.half_bytes;
  Slice slice{};
  size_t first = 0;
  const auto part = [&](size_t round) {
    first = round * launch.half_bytes;
    const size_t bytes = launch.count - first < launch.half_bytes ? launch.count - first : launch.half_bytes;
    slice = block_slice<uint8_t>(bytes, blockIdx.x, gridDim.x);
  };
  run_staged_rounds(
      launch, counter, rounds,
      [&](size_t round, size_t half) {
        part(round);
        block_copy(launch.staging[rank] + half + slice.begin, launch.send + first + slice.begin, slice.end - slice.begin);
      },
      [&](size_t, size_t half) {
        for (int step = 0; step < world; ++step) {
          const int q = (rank + step) % world;  // rotated: spreads the links' load
          char* to = launch.recv + q * launch.rank_stride + first + slice.begin;
          const char* from = q == rank ? launch.send + first + slice.begin : launch.staging[q] + half + slice.begin;
          if (to != from) block_copy(to, from, slice.end - slice.begin);  // in place: the own block is there
        }
      });
}

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_announced(AnnouncedLaunch launch) {
  start_dependent_kernel();
  const StagedLaunch& call = launch.staged;
  __shared__ char* buffers[kAnnouncedBuffers][kMaxWorld];
  char* const own[kAnnouncedBuffers] = {call.recv, nullptr};
  const AnnouncedEntry entry = enter_announced(launch, buffers, own);
  if (entry.path == AnnouncedPath::kEnd) return;
  if (entry.path == AnnouncedPath::kStaged) {
    gather_staged(call, entry.counter);
    return;
  }
  const int world = call.pad.world, rank = call.pad.rank;
  const Slice part = block_slice<uint8_t>(call.count, blockIdx.x, gridDim.x);
  const char* source = call.send + part.begin;
  char* destinations[kMaxWorld];
  int destination_count = 0;
  for (int k = 0; k < world; ++k) {
    char* to = buffers[0][(rank + k) % world] + rank * call.rank_stride + part.begin;  // rotated
    if (to != source) destinations[destination_count++] = to;                          // in place
  }
  block_copy_to(destinations, destination_count, source, part.end - part.begin);
  device::barrier(call.pad, blockIdx.x, call.collective, kSiteExitBarrier, call.plan);
}

}  // namespace

void launch_all_gather_announced(const AnnouncedLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather_announced, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

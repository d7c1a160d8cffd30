// Reduce-scatter of an eager call that announces its input (announced.cuh). launch.staged.count: elements of the
// output; rank_stride: elements between the input's rank blocks. Every rank's input exposed: rank r reduces block r
// of each straight into its output (zero copy), then an exit barrier (every peer has read this rank's input).
// Any rank's not: every rank stages, in rounds of a staging half (NOTE [announced staged rounds]).
#include "core/kernel_modules.hpp"
#include "kernels/announced.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"

namespace braid::kernels {
namespace {

// Round by round: part of every block of this rank's input into its half, at a stride of `chunk` elements;
// every rank's part of block `rank` reduced into the output.
template <typename T, ReduceOp Op>
__device__ void reduce_scatter_staged_rounds(const StagedLaunch& launch, uint64_t counter) {
  const int world = launch.pad.world, rank = launch.pad.rank;
  const size_t chunk_bytes = launch.half_bytes / world / 256 * 256;
  const size_t chunk = chunk_bytes / sizeof(T);
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
        for (int q = 0; q < world; ++q) {
          block_copy(launch.staging[rank] + half + q * chunk_bytes + slice.begin * sizeof(T),
                     launch.send + (q * launch.rank_stride + first + slice.begin) * sizeof(T),
                     (slice.end - slice.begin) * sizeof(T));
        }
      },
      [&](size_t, size_t half) {
        const char* sources[kMaxWorld];
        for (int r = 0; r < world; ++r) sources[r] = launch.staging[r] + half + rank * chunk_bytes;
        char* destination = launch.recv + first * sizeof(T);
        block_reduce<T, Op, kLoadBatch<T>>(sources, world, &destination, 1, slice, 0, 0, world);
      });
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_scatter_announced(AnnouncedLaunch launch) {
  start_dependent_kernel();
  const StagedLaunch& call = launch.staged;
  __shared__ char* buffers[kAnnouncedBuffers][kMaxWorld];
  char* const own[kAnnouncedBuffers] = {const_cast<char*>(call.send), nullptr};
  const AnnouncedEntry entry = enter_announced(launch, buffers, own);
  if (entry.path == AnnouncedPath::kEnd) return;
  if (entry.path == AnnouncedPath::kStaged) {
    reduce_scatter_staged_rounds<T, Op>(call, entry.counter);
    return;
  }
  const int world = call.pad.world, rank = call.pad.rank;
  const char* sources[kMaxWorld];
  for (int r = 0; r < world; ++r) sources[r] = buffers[0][r] + rank * call.rank_stride * sizeof(T);
  char* destination = call.recv;
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &destination, 1, block_slice<T>(call.count, blockIdx.x, gridDim.x),
                                     0, 0, world);
  device::barrier(call.pad, blockIdx.x, call.collective, kSiteExitBarrier, call.plan);
}

}  // namespace

void launch_reduce_scatter_announced(DataType type, ReduceOp op, const AnnouncedLaunch& launch, int blocks,
                                     cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_scatter_announced, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

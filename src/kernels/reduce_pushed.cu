// Reduce on two ranks, pipelined: the other rank pushes its input into the root's FIFOs, and the root reduces
// each piece with its own into its output (docs/dev/selection.md).
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline.cuh"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_pushed(PipelineLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]
  const int rank = launch.pad.rank, root = launch.root, peer = 1 - rank;
  __shared__ int slot[kMaxWorld];
  const PieceGrid<T> grid = piece_grid<T>(launch, 1);
  const size_t rounds = grid.rounds();

  if (rank != root) {
    for (size_t round = 0; round < rounds; ++round) {
      if (!wait_peers(launch, kFree1, kSiteFifoCredit, slot)) return;
      const Slice piece = grid.slice(round, 0);
      block_copy(fifo_piece(launch, root, 0, rank, slot[root]), launch.send + piece.begin * sizeof(T),
                 (piece.end - piece.begin) * sizeof(T));
      post_peers(launch, kData1);
    }
    return;
  }
  const bool own_in_place = (reinterpret_cast<uintptr_t>(launch.send) & (kVectorBytes - 1)) == 0;
  for (size_t round = 0; round < rounds; ++round) {
    const Slice piece = grid.slice(round, 0);
    const size_t bytes = (piece.end - piece.begin) * sizeof(T);
    const char* sources[2];
    if (own_in_place) {
      sources[rank] = launch.send + piece.begin * sizeof(T);
    } else {
      char* own = own_piece(launch, 0, round);
      block_copy(own, launch.send + piece.begin * sizeof(T), bytes);
      __syncthreads();
      sources[rank] = own;
    }
    if (!wait_peers(launch, kData1, kSiteFifoData, slot)) return;
    sources[peer] = fifo_piece(launch, rank, 0, peer, slot[peer]);
    char* destination = launch.recv + piece.begin * sizeof(T);
    block_reduce<T, Op>(sources, 2, &destination, 1, slot_slice<T>(piece.end - piece.begin), 0, 0, 2);
    post_peers(launch, kFree1);
  }
}

}  // namespace

void launch_reduce_pushed(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_pushed, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

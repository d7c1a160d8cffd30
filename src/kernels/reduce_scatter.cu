// Reduce-scatter, pipelined: each round, piece q of the input goes to rank q's FIFO, then the pieces of this
// rank's block are reduced in rank order into the output; the next round is sent before this one is awaited.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline.cuh"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_scatter(PipelineLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]
  const int world = launch.pad.world, rank = launch.pad.rank;
  __shared__ int push_slot[kMaxWorld], pull_slot[kMaxWorld];
  const PieceGrid<T> grid = piece_grid<T>(launch, 1);
  const size_t rounds = grid.rounds();
  // Unaligned: the own block is copied into a slot of its own first.
  const char* own_block = launch.send + rank * launch.rank_stride;
  const bool own_in_place = (reinterpret_cast<uintptr_t>(own_block) & (kVectorBytes - 1)) == 0;

  auto scatter = [&](size_t round) {
    if (!wait_peers(launch, kFree1, kSiteFifoCredit, push_slot)) return false;
    const Slice piece = grid.slice(round, 0);
    for (int k = own_in_place ? 1 : 0; k < world; ++k) {
      // Rotated: in rank order every rank would push to rank 0 first.
      const int q = (rank + k) % world;
      char* to = q == rank ? own_piece(launch, 0, round) : fifo_piece(launch, q, 0, rank, push_slot[q]);
      block_copy(to, launch.send + q * launch.rank_stride + piece.begin * sizeof(T), (piece.end - piece.begin) * sizeof(T));
    }
    post_peers(launch, kData1);
    return true;
  };

  if (rounds > 0 && !scatter(0)) return;
  for (size_t round = 0; round < rounds; ++round) {
    if (round + 1 < rounds && !scatter(round + 1)) return;
    if (!wait_peers(launch, kData1, kSiteFifoData, pull_slot)) return;
    const Slice piece = grid.slice(round, 0);
    const char* sources[kMaxWorld];
    for (int r = 0; r < world; ++r) sources[r] = fifo_piece(launch, rank, 0, r, pull_slot[r]);
    sources[rank] = own_in_place ? own_block + piece.begin * sizeof(T) : own_piece(launch, 0, round);
    char* destination = launch.recv + piece.begin * sizeof(T);
    block_reduce<T, Op>(sources, world, &destination, 1, slot_slice<T>(piece.end - piece.begin), 0, 0, world);
    post_peers(launch, kFree1);
  }
}

}  // namespace

void launch_reduce_scatter(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_scatter, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

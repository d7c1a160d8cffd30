// Reduce-scatter, pipelined: each round, block b takes one piece of the rank block; piece q of the input (rank
// block q) is stored into rank q's FIFO (NVLink), and once every peer's piece of this rank's block arrived the
// rank reduces them with its own piece (rank order) into its output: its own piece straight from the input where
// it is 16-byte aligned, from a copy in a slot of its own otherwise (an extra HBM read and write of 1/world of
// the input, which large messages feel, so the aligned case skips it). The next round's pieces are sent before
// this round's are awaited. (world-1)/world of the input crosses NVLink, once.
//
// launch.count: elements of one rank block (the output); launch.rank_stride: bytes between input rank blocks.
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
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int world = launch.pad.world, rank = launch.pad.rank;
  __shared__ int push_slot[kMaxWorld], pull_slot[kMaxWorld];
  const PieceGrid<T> grid = piece_grid<T>(launch, 1);
  const size_t rounds = grid.rounds();
  // This rank's own block is reduced straight from the input where 16-byte vector loads may read it (pieces
  // start on whole vectors); otherwise it is copied into a slot of its own first.
  const char* own_block = launch.send + rank * launch.rank_stride;
  const bool own_in_place = (reinterpret_cast<uintptr_t>(own_block) & (kVectorBytes - 1)) == 0;

  auto scatter = [&](size_t round) {
    if (!wait_peers(launch, kFree1, kSiteFifoCredit, push_slot)) return false;
    const Slice piece = grid.slice(round, 0);
    for (int k = own_in_place ? 1 : 0; k < world; ++k) {
      // Rotated, starting with the rank after this one: in rank order, every rank would push to rank 0 first
      // and one GPU's ingress would take three senders while the others' idle.
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

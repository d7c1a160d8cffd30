// All-reduce, two shot, pipelined (pipeline.cuh): each round, block b scatters piece q of its input into rank q's
// phase-1 FIFO, reduces its own shard's pieces into its output and every peer's phase-2 FIFO, and gathers the
// other shards. The next round's scatter goes out before this round's gather waits. Reduce (launch.root >= 0):
// the gather goes to the root alone; other ranks write no output (may be null).
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline.cuh"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_two_shot(PipelineLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int world = launch.pad.world, rank = launch.pad.rank;
  __shared__ int push_slot[kMaxWorld], pull_slot[kMaxWorld];
  const PieceGrid<T> grid = piece_grid<T>(launch, world);
  const size_t rounds = grid.rounds();
  // Unaligned, the own piece is copied into a slot first.
  const bool own_in_place = (reinterpret_cast<uintptr_t>(launch.send) & (kVectorBytes - 1)) == 0;
  const bool rooted = launch.root >= 0, gathers = !rooted || rank == launch.root;
  const unsigned int gather_to = !rooted ? kEveryPeer : rank == launch.root ? 0u : 1u << launch.root;
  const unsigned int gather_from = gathers ? kEveryPeer : 0u;

  auto scatter = [&](size_t round) {
    if (!wait_peers(launch, kFree1, kSiteFifoCredit, push_slot)) return false;
    for (int k = own_in_place ? 1 : 0; k < world; ++k) {
      const int q = (rank + k) % world;  // rotated: no GPU's ingress takes every sender at once
      const Slice piece = grid.slice(round, q);
      char* to = q == rank ? own_piece(launch, 0, round) : fifo_piece(launch, q, 0, rank, push_slot[q]);
      block_copy(to, launch.send + piece.begin * sizeof(T), (piece.end - piece.begin) * sizeof(T));
    }
    post_peers(launch, kData1);
    return true;
  };

  if (rounds > 0 && !scatter(0)) return;
  for (size_t round = 0; round < rounds; ++round) {
    if (!wait_peers(launch, kData1, kSiteFifoData, pull_slot)) return;
    if (!wait_peers(launch, kFree2, kSiteFifoCredit, push_slot, gather_to)) return;
    const Slice mine = grid.slice(round, rank);
    const char* sources[kMaxWorld];
    char* destinations[kMaxWorld];
    int destination_count = 0;
    if (gathers) destinations[destination_count++] = launch.recv + mine.begin * sizeof(T);
    for (int r = 0; r < world; ++r) sources[r] = fifo_piece(launch, rank, 0, r, pull_slot[r]);
    sources[rank] = own_in_place ? launch.send + mine.begin * sizeof(T) : own_piece(launch, 0, round);
    for (int k = 1; k < world; ++k) {  // rotated
      const int r = (rank + k) % world;
      if ((gather_to >> r) & 1u) destinations[destination_count++] = fifo_piece(launch, r, 1, rank, push_slot[r]);
    }
    block_reduce<T, Op>(sources, world, destinations, destination_count, slot_slice<T>(mine.end - mine.begin), 0, 0, world);
    post_peers(launch, kData2, gather_to);
    post_peers(launch, kFree1);
    if (round + 1 < rounds && !scatter(round + 1)) return;

    if (!gathers) continue;
    if (!wait_peers(launch, kData2, kSiteFifoData, pull_slot, gather_from)) return;
    for (int q = 0; q < world; ++q) {
      if (q == rank) continue;
      const Slice piece = grid.slice(round, q);
      block_copy(launch.recv + piece.begin * sizeof(T), fifo_piece(launch, rank, 1, q, pull_slot[q]),
                 (piece.end - piece.begin) * sizeof(T));
    }
    post_peers(launch, kFree2, gather_from);
  }
}

}  // namespace

void launch_all_reduce_two_shot(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_two_shot, type, op, blocks, stream, launch);
}

void launch_reduce_two_shot(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_two_shot, type, op, blocks, stream, launch);  // launch.root >= 0
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

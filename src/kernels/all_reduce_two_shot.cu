// All-reduce, two shot, pipelined: a reduce-scatter then an all-gather, both by pushes through FIFOs
// (pipeline.cuh), so any user buffer of any size runs in one launch with no barrier.
//
// Each round, block b owns world pieces of the buffer, piece q belonging to shard q. Per round:
//   1. scatter: piece q of this rank's input is stored into rank q's phase-1 FIFO (NVLink); its own piece is
//      read in place where it is 16-byte aligned, otherwise copied into a slot of its own (the copy is an extra
//      HBM read and write that large messages feel);
//   2. reduce: once every peer's piece of this rank's shard arrived, the rank reduces them (rank order, so every
//      rank computes bit-identical results) into its output and stores the result into every peer's phase-2 FIFO;
//   3. gather: the reduced pieces of the other shards arrive and are copied into the output.
// The next round's scatter is issued before waiting for this round's gather, so NVLink carries both at once.
// Every byte crosses NVLink (world-1)/world times each way per phase: the algorithm for large messages.
//
// Reduce (launch.root >= 0) is the same kernel with the gather to the root alone: the other ranks store their
// reduced pieces into the root's phase-2 FIFO and none into their own output (which may be null), the root
// stores its own into its output and gathers. The root takes in (world-1)/world of the buffer per phase, where a
// staged reduce has it load (world-1) whole buffers from the peers' staging.
// The scatter pushes one piece to one peer at a time, its own (a local copy, unless read in place) first, then
// rank + 1, rank + 2, ...: in rank order,
// every rank would push to rank 0 first, then rank 1, ..., and one GPU's ingress would take three senders while
// the others' idle.
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
  // This rank's own shard is reduced straight from the input where 16-byte vector loads may read it (pieces
  // start on whole vectors); otherwise it is copied into a slot of its own first.
  const bool own_in_place = (reinterpret_cast<uintptr_t>(launch.send) & (kVectorBytes - 1)) == 0;
  // Who takes this rank's reduced pieces, and whose this rank gathers (peer masks): every peer's for all-reduce;
  // for reduce, the root's alone, and the root gathers from every peer.
  const bool rooted = launch.root >= 0, gathers = !rooted || rank == launch.root;
  const unsigned int gather_to = !rooted ? kEveryPeer : rank == launch.root ? 0u : 1u << launch.root;
  const unsigned int gather_from = gathers ? kEveryPeer : 0u;

  auto scatter = [&](size_t round) {
    if (!wait_peers(launch, kFree1, kSiteFifoCredit, push_slot)) return false;
    for (int k = own_in_place ? 1 : 0; k < world; ++k) {
      const int q = (rank + k) % world;  // rotated: see the note at the top
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
    for (int k = 1; k < world; ++k) {  // rotated, as the scatter
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

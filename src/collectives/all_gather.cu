// All-gather, pipelined: each round, block b takes one piece of this rank's input and stores it into every
// peer's FIFO (NVLink, the source read once) and into its own slot of the output; the peers' pieces of the
// round are copied from this rank's FIFOs into their slots of the output. The next round's pieces are sent
// before this round's are awaited. Datatype-blind: launch.count is in bytes.
//
// launch.rank_stride: bytes between rank blocks of the output.
#include "collectives/kernels.hpp"
#include "collectives/pipeline.cuh"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather(PipelineLaunch launch) {
  const int world = launch.pad.world, rank = launch.pad.rank;
  __shared__ int push_slot[kMaxWorld], pull_slot[kMaxWorld];
  const PieceGrid<uint8_t> grid = piece_grid<uint8_t>(launch, 1);
  const size_t rounds = grid.rounds();

  auto push = [&](size_t round) {
    if (!wait_peers(launch, kFree1, kSiteFifoCredit, push_slot)) return false;
    const Slice piece = grid.slice(round, 0);
    char* destinations[kMaxWorld];
    int count = 0;
    for (int q = 0; q < world; ++q) {
      char* own = launch.recv + rank * launch.rank_stride + piece.begin;
      if (q != rank) destinations[count++] = fifo_piece(launch, q, 0, rank, push_slot[q]);
      else if (own != launch.send + piece.begin) destinations[count++] = own;  // in place: already there
    }
    block_copy_to(destinations, count, launch.send + piece.begin, piece.end - piece.begin);
    post_peers(launch, kData1);
    return true;
  };

  if (rounds > 0 && !push(0)) return;
  for (size_t round = 0; round < rounds; ++round) {
    if (round + 1 < rounds && !push(round + 1)) return;
    if (!wait_peers(launch, kData1, kSiteFifoData, pull_slot)) return;
    const Slice piece = grid.slice(round, 0);
    for (int q = 0; q < world; ++q) {
      if (q == rank) continue;
      block_copy(launch.recv + q * launch.rank_stride + piece.begin, fifo_piece(launch, rank, 0, q, pull_slot[q]),
                 piece.end - piece.begin);
    }
    post_peers(launch, kFree1);
  }
}

}  // namespace

void launch_all_gather(const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  all_gather<<<blocks, kThreadsPerBlock, 0, stream>>>(launch);
}

}  // namespace braid::kernels

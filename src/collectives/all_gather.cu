// All-gather, pipelined: block b takes one piece of this rank's input a round. Its push group (pipeline.cuh,
// kPushThreads) stores the piece into every peer's FIFO (NVLink, the source read once) as credits allow; its
// copy group copies the piece into this rank's own slot of the output and the peers' pieces of the round from
// this rank's FIFOs into theirs. Datatype-blind: launch.count is in bytes.
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
  const WarpGroup group = WarpGroup::half_of_block(kPushThreads);

  if (group.id == 0) {  // push: this rank's piece into every peer's FIFO, the source read once
    for (size_t round = 0; round < rounds; ++round) {
      if (!wait_peers(launch, kFree1, kSiteFifoCredit, push_slot, kEveryPeer, group)) return;
      const Slice piece = grid.slice(round, 0);
      char* destinations[kMaxWorld];
      int count = 0;
      for (int q = 0; q < world; ++q) {
        if (q != rank) destinations[count++] = fifo_piece(launch, q, 0, rank, push_slot[q]);
      }
      group_copy_to(destinations, count, launch.send + piece.begin, piece.end - piece.begin, group.lane(), group.threads);
      post_peers(launch, kData1, kEveryPeer, group);
    }
  } else {  // copy out: this rank's own piece (unless in place), then the peers' from the FIFOs
    for (size_t round = 0; round < rounds; ++round) {
      const Slice piece = grid.slice(round, 0);
      group.copy(launch.recv + rank * launch.rank_stride + piece.begin, launch.send + piece.begin, piece.end - piece.begin);
      if (!wait_peers(launch, kData1, kSiteFifoData, pull_slot, kEveryPeer, group)) return;
      for (int q = 0; q < world; ++q) {
        if (q == rank) continue;
        group.copy(launch.recv + q * launch.rank_stride + piece.begin, fifo_piece(launch, rank, 0, q, pull_slot[q]),
                   piece.end - piece.begin);
      }
      post_peers(launch, kFree1, kEveryPeer, group);
    }
  }
}

}  // namespace

void launch_all_gather(const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  all_gather<<<blocks, kThreadsPerBlock, 0, stream>>>(launch);
}

}  // namespace braid::kernels

// All-gather, pipelined (pipeline.cuh): each round a block's push group stores a piece of the input into every
// peer's FIFO; its copy group copies it and the peers' pieces into the output. count, rank_stride: bytes.
// Broadcast (launch.root >= 0, rank_stride 0): the root alone pushes.
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline.cuh"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

// A broadcast root copies only its own input, so spares more threads for pushing; more would slow its copy.
constexpr int kBroadcastRootPushThreads = 256;

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather(PipelineLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int world = launch.pad.world, rank = launch.pad.rank;
  __shared__ int push_slot[kMaxWorld], pull_slot[kMaxWorld];
  const PieceGrid<uint8_t> grid = piece_grid<uint8_t>(launch, 1);
  const size_t rounds = grid.rounds();
  const bool rooted = launch.root >= 0, pushes = !rooted || rank == launch.root;
  const int push_threads = !rooted ? kPushThreads : pushes ? kBroadcastRootPushThreads : 0;
  const WarpGroup group = WarpGroup::half_of_block(push_threads);
  const unsigned int pull_from = !rooted ? kEveryPeer : rank == launch.root ? 0u : 1u << launch.root;

  if (group.id == 0) {
    for (size_t round = 0; pushes && round < rounds; ++round) {
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
  } else {
    for (size_t round = 0; round < rounds; ++round) {
      const Slice piece = grid.slice(round, 0);
      if (pushes) group.copy(launch.recv + rank * launch.rank_stride + piece.begin, launch.send + piece.begin, piece.end - piece.begin);
      if (!wait_peers(launch, kData1, kSiteFifoData, pull_slot, pull_from, group)) return;
      for (int q = 0; q < world; ++q) {
        if (q == rank || !((pull_from >> q) & 1u)) continue;
        group.copy(launch.recv + q * launch.rank_stride + piece.begin, fifo_piece(launch, rank, 0, q, pull_slot[q]),
                   piece.end - piece.begin);
      }
      post_peers(launch, kFree1, pull_from, group);
    }
  }
}

}  // namespace

void launch_all_gather(const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather, blocks, kThreadsPerBlock, stream, launch);
}

void launch_broadcast_pipelined(const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

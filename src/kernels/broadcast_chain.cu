// Broadcast, pipelined along a chain from the root in rank order: each rank stores a piece from the previous
// rank's push (the root: its input), in one read, into the next rank's FIFO and its output. launch.count: bytes.
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline.cuh"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) broadcast_chain(PipelineLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int world = launch.pad.world, rank = launch.pad.rank;
  const ChainLink link = ChainLink::at(launch, (rank - launch.root + world) % world);
  const PieceGrid<uint8_t> grid = piece_grid<uint8_t>(launch, 1);
  const size_t rounds = grid.rounds();
  for (size_t round = 0; round < rounds; ++round) {
    const Slice piece = grid.slice(round, 0);
    int pull = 0, push = 0;
    if (!link.wait(launch, &pull, &push)) return;
    const char* source = link.receives ? fifo_piece(launch, rank, 0, link.previous, pull) : launch.send + piece.begin;
    char* destinations[2];
    int targets = 0;
    if (link.forwards) destinations[targets++] = fifo_piece(launch, link.next, 0, rank, push);
    if (launch.recv + piece.begin != source) destinations[targets++] = launch.recv + piece.begin;  // not in place
    group_copy_to(destinations, targets, source, piece.end - piece.begin, threadIdx.x, blockDim.x);
    link.post(launch);
  }
}

}  // namespace

void launch_broadcast_chain(const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(broadcast_chain, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

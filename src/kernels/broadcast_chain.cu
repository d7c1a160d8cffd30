// Broadcast, pipelined on three ranks or more: a chain from the root through every rank in rank order (rank
// root + 1, root + 2, ... modulo the world). Block b takes one piece of the buffer a round. The root stores it
// into the next rank's FIFO (pipeline.cuh) and its own output; every rank after it waits for the piece in its
// FIFO from the previous rank, stores it into the next rank's FIFO (but the last) and its own output from one
// read, and hands the slot back. Every byte crosses every link of the chain once: the root sends the buffer once,
// where pushing into every peer would send it world - 1 times over the root's links. Datatype-blind: launch.count
// is in bytes. (On two ranks the chain is the root pushing into its one peer: all_gather.cu's kernel.)
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
  const ChainLink link = ChainLink::at(launch, (rank - launch.root + world) % world);  // the root: first
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
    if (launch.recv + piece.begin != source) destinations[targets++] = launch.recv + piece.begin;  // not the root in place
    group_copy_to(destinations, targets, source, piece.end - piece.begin, threadIdx.x, blockDim.x);
    link.post(launch);
  }
}

}  // namespace

void launch_broadcast_chain(const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(broadcast_chain, blocks, kThreadsPerBlock, stream, launch);  // launch.root >= 0
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

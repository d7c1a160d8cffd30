// Broadcast, pipelined on three ranks or more: a chain from the root through every rank in rank order (rank
// root + 1, root + 2, ... modulo the world). Block b takes one piece of the buffer a round. The root stores it
// into the next rank's FIFO (pipeline.cuh) and its own output; every rank after it waits for the piece in its
// FIFO from the previous rank, stores it into the next rank's FIFO (but the last) and its own output from one
// read, and hands the slot back. Every byte crosses every link of the chain once: the root sends the buffer once,
// where pushing into every peer would send it world - 1 times over the root's links. Datatype-blind: launch.count
// is in bytes. (On two ranks the chain is the root pushing into its one peer: all_gather.cu's kernel.)
#include "collectives/dependent_launch.cuh"
#include "collectives/kernels.hpp"
#include "collectives/pipeline.cuh"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

// The threads that wait for the previous rank's piece and for the next rank's free slot: one in each of two
// warps, so that both waits run at once and the two signals after the copy leave from different warps.
constexpr int kDataThread = 0, kCreditThread = 32;

__global__ void __launch_bounds__(kThreadsPerBlock) broadcast_chain(PipelineLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank;
  const int position = (rank - launch.root + world) % world;  // in the chain; the root's is 0
  const int previous = (rank + world - 1) % world, next = (rank + 1) % world;
  const bool receives = position > 0, forwards = position < world - 1;
  const PieceGrid<uint8_t> grid = piece_grid<uint8_t>(launch, 1);
  const size_t rounds = grid.rounds();
  const device::PlanCheck plan{launch.plan, static_cast<int>(blockIdx.x)};
  __shared__ int failed, pull_slot, push_slot;
  if (threadIdx.x == 0) failed = 0;
  for (size_t round = 0; round < rounds; ++round) {
    const Slice piece = grid.slice(round, 0);
    __syncthreads();  // the last round's readers of the slots are done (and `failed` is set)
    uint64_t count = 0;
    if (receives && threadIdx.x == kDataThread) {
      if (!device::wait(launch.pad, pad_channel(kData1), previous, launch.collective, kSiteFifoData, &count, plan)) failed = 1;
      pull_slot = fifo_slot(count);
    }
    if (forwards && threadIdx.x == kCreditThread) {
      if (!device::wait(launch.pad, pad_channel(kFree1), next, launch.collective, kSiteFifoCredit, &count, plan)) failed = 1;
      push_slot = fifo_slot(count);
    }
    __syncthreads();
    if (failed) return;
    const char* source = receives ? fifo_piece(launch, rank, 0, previous, pull_slot) : launch.send + piece.begin;
    char* destinations[2];
    int targets = 0;
    if (forwards) destinations[targets++] = fifo_piece(launch, next, 0, rank, push_slot);
    if (launch.recv + piece.begin != source) destinations[targets++] = launch.recv + piece.begin;  // not the root in place
    group_copy_to(destinations, targets, source, piece.end - piece.begin, threadIdx.x, blockDim.x);
    __syncthreads();  // the block's stores and loads of the piece come before the signals' releases
    if (forwards && threadIdx.x == kDataThread) device::signal(launch.pad, pad_channel(kData1), next);
    if (receives && threadIdx.x == kCreditThread) device::signal(launch.pad, pad_channel(kFree1), previous);
  }
}

}  // namespace

void launch_broadcast_chain(const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(broadcast_chain, blocks, kThreadsPerBlock, stream, launch);  // launch.root >= 0
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

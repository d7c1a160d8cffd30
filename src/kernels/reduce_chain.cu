// Reduce, pipelined, on 3+ ranks: a chain through every rank ending at the root, each rank adding its piece to
// the partial from its FIFO (rounded per hop; avg divides at the root). Only the root's output is written.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline.cuh"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_chain(PipelineLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]
  constexpr ReduceOp kPartialOp = Op == ReduceOp::kAvg ? ReduceOp::kSum : Op;
  const int world = launch.pad.world, rank = launch.pad.rank;
  const ChainLink link = ChainLink::at(launch, (rank - launch.root - 1 + 2 * world) % world);  // the root: last
  const bool own_in_place = (reinterpret_cast<uintptr_t>(launch.send) & (kVectorBytes - 1)) == 0;
  const PieceGrid<T> grid = piece_grid<T>(launch, 1);
  const size_t rounds = grid.rounds();
  for (size_t round = 0; round < rounds; ++round) {
    const Slice piece = grid.slice(round, 0);
    const size_t elements = piece.end - piece.begin, bytes = elements * sizeof(T);
    const char* own = launch.send + piece.begin * sizeof(T);
    if (link.receives && !own_in_place) {  // a copy of its own, overlapping the waits
      char* copy = own_piece(launch, 0, round);
      block_copy(copy, own, bytes);
      own = copy;
    }
    int pull = 0, push = 0;
    if (!link.wait(launch, &pull, &push)) return;
    char* destination = link.forwards ? fifo_piece(launch, link.next, 0, rank, push) : launch.recv + piece.begin * sizeof(T);
    if (!link.receives) {
      block_copy(destination, own, bytes);
    } else {
      const char* sources[2] = {fifo_piece(launch, rank, 0, link.previous, pull), own};
      if (link.forwards) {
        block_reduce<T, kPartialOp>(sources, 2, &destination, 1, slot_slice<T>(elements), 0, 0, world);
      } else {
        block_reduce<T, Op>(sources, 2, &destination, 1, slot_slice<T>(elements), 0, 0, world);
      }
    }
    link.post(launch);
  }
}

}  // namespace

void launch_reduce_chain(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_chain, type, op, blocks, stream, launch);  // launch.root >= 0
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

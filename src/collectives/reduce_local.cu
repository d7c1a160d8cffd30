// Reduction of sources in this GPU's own memory into one output, for the copy-engine reduce-scatter and reduce:
// copy engines pull the peers' blocks into staging, this kernel combines them with this rank's block (rank
// order) while the engines pull the next chunk. No barrier and no signal: the host orders it after the pulls.
#include "collectives/dispatch.cuh"
#include "collectives/elementwise.cuh"
#include "collectives/kernels.hpp"
#include "collectives/local_reduce_launch.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_local(LocalReduceLaunch launch) {
  const char* sources[kMaxWorld];
  for (int s = 0; s < launch.source_count; ++s) sources[s] = launch.sources[s];
  char* destination = launch.destination;
  block_reduce<T, Op, kLoadBatch<T>>(sources, launch.source_count, &destination, 1,
                                     block_slice<T>(launch.count, blockIdx.x, gridDim.x), 0, 0, launch.world);
}

}  // namespace

void launch_reduce_local(DataType type, ReduceOp op, const LocalReduceLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_local, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

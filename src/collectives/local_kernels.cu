// The SM kernels that work beside the copy engines, on this GPU's own memory only (no barrier, no signal: the
// host orders them against the copies):
//   - a local copy (this rank's own block), so the engines are left to the peers' blocks: a local copy on an
//     engine beside a push over NVLink slowed the push;
//   - a reduction of sources into one output (copy-engine reduce-scatter and reduce): the engines pull the
//     peers' blocks into staging, the kernel combines them with this rank's block, in rank order, while the
//     engines pull the next chunk.
#include "collectives/dispatch.cuh"
#include "collectives/elementwise.cuh"
#include "collectives/kernels.hpp"
#include "collectives/local_reduce_launch.hpp"
#include "core/kernel_modules.hpp"

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

// Block b copies its slice of whole 16-byte vectors (the last one the tail too).
__global__ void __launch_bounds__(kThreadsPerBlock) copy_local(char* destination, const char* source, size_t bytes) {
  const Slice slice = block_slice<uint8_t>(bytes, blockIdx.x, gridDim.x);
  block_copy(destination + slice.begin, source + slice.begin, slice.end - slice.begin);
}

}  // namespace

void launch_copy_local(void* destination, const void* source, size_t bytes, int blocks, cudaStream_t stream) {
  copy_local<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<char*>(destination), static_cast<const char*>(source),
                                                      bytes);
}

void launch_reduce_local(DataType type, ReduceOp op, const LocalReduceLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_local, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

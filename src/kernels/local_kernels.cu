// The SM copy of this rank's own block beside the copy engines (a local copy on an engine slows its push); the
// host orders it against the copies.
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) copy_local(char* destination, const char* source, size_t bytes) {
  start_dependent_kernel();
  const Slice slice = block_slice<uint8_t>(bytes, blockIdx.x, gridDim.x);
  block_copy(destination + slice.begin, source + slice.begin, slice.end - slice.begin);
}

}  // namespace

void launch_copy_local(void* destination, const void* source, size_t bytes, int blocks, cudaStream_t stream) {
  launch_dependent(copy_local, blocks, kThreadsPerBlock, stream, static_cast<char*>(destination), static_cast<const char*>(source),
                                                      bytes);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

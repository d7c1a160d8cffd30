// The SM kernel that works beside the copy engines, on this GPU's own memory only (no barrier, no signal: the
// host orders it against the copies): a local copy of this rank's own block, so the engines are left to the
// peers' blocks (a local copy on an engine beside a push over NVLink slowed the push).
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

// Block b copies its slice of whole 16-byte vectors (the last one the tail too).
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

// Programmatic dependent launch: a kernel launched with launch_dependent may start while the previous one runs,
// and must call wait_for_prior_grid() (returns once that one completed, its writes visible) before touching what
// it writes. Both calls are no-ops in an ordinary launch.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "core/cuda_check.hpp"

namespace braid::kernels {

__device__ __forceinline__ void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// The first statement of every kernel launched with launch_dependent.
__device__ __forceinline__ void start_dependent_kernel() {
  wait_for_prior_grid();
  allow_dependent_grid();
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  BRAID_CUDA(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace braid::kernels

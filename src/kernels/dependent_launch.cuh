// Programmatic dependent launch (Hopper): a kernel launched with launch_dependent may have its blocks scheduled
// while the kernel before it on the stream is still running, so the launch's latency hides behind that kernel's
// tail; it must call wait_for_prior_grid() before it touches anything the earlier kernel writes (the wait
// returns once that kernel has completed and its writes are visible). A kernel that lets the next one start
// early calls allow_dependent_grid(); the next one's blocks are scheduled once every block of this one has
// called it or exited. Both are no-ops in a kernel launched the ordinary way, and under stream capture the
// launch becomes a programmatic edge of the graph.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "core/cuda_check.hpp"

namespace braid::kernels {

__device__ __forceinline__ void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// The first statement of every kernel braid launches with launch_dependent (collectives, MoE): wait for the kernel
// before it on the stream, then let the next one be scheduled. The next kernel's launch then overlaps this one's
// run, and only one kernel waits ahead of the one running.
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

// A kernel alone in its module (this .cu file) that only the kernel-preload test launches: under lazy loading its
// first launch loads the module, as a braid kernel's would without the preload.
#pragma once

#include <cuda_runtime_api.h>

namespace braid::testing {

// Launches the kernel on stream (one thread adds 1 to data[0]); returns the launch's error.
cudaError_t launch_fresh_kernel(cudaStream_t stream, int* data);

}  // namespace braid::testing

// A device-side delay for the stress tests: one thread that spins on the GPU's global timer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace braid::testing {

// Enqueues a kernel on stream that busy-waits `nanoseconds` (as measured by %globaltimer) and exits.
// Returns the launch's error.
cudaError_t spin_on_stream(cudaStream_t stream, uint32_t nanoseconds);

}  // namespace braid::testing

// Device-side delays for the tests: a kernel that spins for a time, and one that holds its GPU until the host
// releases it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace braid::testing {

// Enqueues a kernel on stream that busy-waits `nanoseconds` (as measured by %globaltimer) and exits.
// Returns the launch's error.
cudaError_t spin_on_stream(cudaStream_t stream, uint32_t nanoseconds);

// Enqueues a one-thread kernel on stream that spins until *released (host-mapped memory) is non-zero, or until
// `max_nanoseconds` have passed, whichever comes first. Returns the launch's error.
cudaError_t hold_until_released(cudaStream_t stream, const volatile int* released, uint64_t max_nanoseconds);

}  // namespace braid::testing

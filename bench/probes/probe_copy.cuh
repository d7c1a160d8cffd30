// What the copy probes share: copy_range, the SM copy of 16-byte vectors their kernels run.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

// Vectors [begin, end) copied by the block, each thread keeping U loads in flight.
template <int U>
__device__ __forceinline__ void copy_range(const uint4* __restrict__ from, uint4* __restrict__ to, size_t begin, size_t end) {
  const size_t stride = blockDim.x;
  for (size_t i = begin + threadIdx.x; i < end; i += U * stride) {
    uint4 value[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i + u * stride < end) value[u] = from[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i + u * stride < end) to[i + u * stride] = value[u];
    }
  }
}

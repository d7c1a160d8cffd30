// What the reduction probes share: add_into, the float32 sum their SMs run; fill, their inputs with a known sum
// across two GPUs, and filled_input, which makes them; slower_gpu_median_us, their timing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "probe_check.cuh"

// out = a + b, 16-byte vectors of floats (out may be a or b).
__global__ void __launch_bounds__(512) add_into(const float4* __restrict__ a, const float4* __restrict__ b,
                                                float4* __restrict__ out, size_t vectors) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors; i += size_t(gridDim.x) * blockDim.x) {
    const float4 x = a[i], y = b[i];
    out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

// Every element of GPU g's input: g + 1 + (index mod 7); the sum over GPUs 0 and 1 is two_gpu_sum(index).
__global__ void fill(float* data, size_t count, int g) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    data[i] = float(g + 1 + int(i % 7));
  }
}

inline float two_gpu_sum(size_t index) { return float(3 + 2 * int(index % 7)); }

// The slower of GPUs 0 and 1's median time in us over 7 runs after 2 warm-ups. Before each run `poison(g)`
// enqueues on GPU g what resets its output, which completes before `issue()` enqueues the run; GPU g's run is
// timed between its events start[g] and stop[g], which `issue` records.
template <typename Poison, typename Issue>
float slower_gpu_median_us(Poison&& poison, Issue&& issue, const cudaEvent_t (&start)[2], const cudaEvent_t (&stop)[2]) {
  std::vector<float> times[2];
  for (int it = 0; it < 9; ++it) {
    for (int g = 0; g < 2; ++g) {
      CHECK(cudaSetDevice(g));
      poison(g);
      CHECK(cudaDeviceSynchronize());
    }
    issue();
    for (int g = 0; g < 2; ++g) {
      const float ms = elapsed_ms(g, start[g], stop[g]);
      if (it >= 2) times[g].push_back(ms * 1000.f);
    }
  }
  float worst = 0;
  for (int g = 0; g < 2; ++g) {
    std::sort(times[g].begin(), times[g].end());
    worst = std::max(worst, times[g][times[g].size() / 2]);
  }
  return worst;
}

// Makes GPU g current with access to the other GPU's memory, and returns `bytes` of input on it, filled (fill).
inline char* filled_input(int g, size_t bytes) {
  CHECK(cudaSetDevice(g));
  CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
  char* input = nullptr;
  CHECK(cudaMalloc(&input, bytes));
  fill<<<1024, 256>>>(reinterpret_cast<float*>(input), bytes / 4, g);
  CHECK(cudaGetLastError());
  return input;
}

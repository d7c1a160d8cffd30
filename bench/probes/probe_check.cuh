// What the probes share: CHECK (runtime calls) and CU_CHECK (driver calls), which end the probe with the
// failing call, file and line, and elapsed_ms (event timing).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                                 \
  do {                                                                                              \
    cudaError_t err_ = (call);                                                                      \
    if (err_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

#define CU_CHECK(call)                                                                               \
  do {                                                                                               \
    CUresult result_ = (call);                                                                       \
    if (result_ != CUDA_SUCCESS) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #call, static_cast<int>(result_)); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

// Milliseconds between two events recorded on `device`, once the second has completed.
inline float elapsed_ms(int device, cudaEvent_t start, cudaEvent_t stop) {
  CHECK(cudaSetDevice(device));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

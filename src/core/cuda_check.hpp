// Checking CUDA runtime and driver results: failures become braid::Error carrying the call,
// the code's name and the rank.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/cuda_driver.hpp"

namespace braid {

[[noreturn]] void raise_cuda(cudaError_t result, const char* call, const char* file, int line);
[[noreturn]] void raise_driver(CUresult result, const char* call, const char* file, int line);

// Throws kNoDevice when this machine has no usable CUDA driver (none, or one older than the runtime) or no device;
// returns the device count.
int require_cuda_devices(const char* what);

}  // namespace braid

// BRAID_CUDA(cudaMalloc(&p, n)) — runtime call, checked.
#define BRAID_CUDA(expr)                                                            \
  do {                                                                              \
    cudaError_t braid_result_ = (expr);                                             \
    if (braid_result_ != cudaSuccess) ::braid::raise_cuda(braid_result_, #expr, __FILE__, __LINE__); \
  } while (0)

// BRAID_CU(cuMemCreate, &handle, bytes, &prop, 0) — driver call through the entry-point table, checked.
#define BRAID_CU(function, ...)                                                     \
  do {                                                                              \
    CUresult braid_result_ = ::braid::driver().function(__VA_ARGS__);               \
    if (braid_result_ != CUDA_SUCCESS) ::braid::raise_driver(braid_result_, #function, __FILE__, __LINE__); \
  } while (0)

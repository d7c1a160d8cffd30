// braid's own GEMM for Hopper GPUs (compute capability 9.0): D = alpha * A x B^T + beta * C, with B given as
// [n, k] (a Linear weight, the fused calls' Layout::kTransposed), bf16 or fp16 in and out, float32 accumulation.
// The fused calls offer it beside cuBLASLt's candidates and keep whichever runs a shape faster where it runs
// (NOTE [GEMM algorithm choice] in overlap/cublaslt.cpp); NOTE [Hopper GEMM] in matmul_sm90.cu says how it works.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "braid/types.hpp"

namespace braid::kernels {

struct Sm90Matmul {
  DataType type;  // kBFloat16 or kFloat16, every matrix
  size_t rows, k, n;
  const void* a;  // [rows, k], row-major
  const void* b;  // [n, k], row-major
  const void* c;  // [rows, n], row-major, or null (no C)
  void* d;        // [rows, n], row-major; may be c itself
  float alpha = 1.0f;
  float beta = 0.0f;  // ignored where c is null
  int multiprocessors = 0;  // the thread blocks it runs on (it is persistent); 0: every multiprocessor
};

// Whether `device`, the current device, runs the kernel: compute capability 9.0, a driver with
// cuTensorMapEncodeTiled, and room for its clusters (the occupancy query, made once a device and datatype).
bool sm90_matmul_available(int device);

// Whether the kernel takes `matmul` (on a device where it is available): bf16 or fp16; rows, k and n in [1, 2^30);
// k and n multiples of 8; a, b, c (if any) and d 16-byte aligned; multiprocessors 0 or at least 2.
bool sm90_matmul_supports(const Sm90Matmul& matmul);

// Enqueues the GEMM on the current device, which must be `sm90_matmul_available` and run `matmul` (supported).
// Returns the launch's error (cudaSuccess where it was enqueued).
cudaError_t launch_sm90_matmul(const Sm90Matmul& matmul, cudaStream_t stream);

}  // namespace braid::kernels

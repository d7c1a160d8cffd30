// What every example needs beside braid: a CUDA check that stops the program with the call's name, and a
// cudaFree of several buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define EXAMPLE_CUDA(call)                                                                           \
  do {                                                                                               \
    cudaError_t error_ = (call);                                                                     \
    if (error_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(error_), __FILE__, __LINE__); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

template <typename... Pointers>
void free_all(Pointers... pointers) {
  for (void* pointer : {static_cast<void*>(pointers)...}) EXAMPLE_CUDA(cudaFree(pointer));
}

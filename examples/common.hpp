// What every example needs beside braid: a CUDA check that stops the program with the call's name.
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

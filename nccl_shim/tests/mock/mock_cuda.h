/* The mock CUDA's hooks for the mock NCCL: work on a stream runs now, or is recorded while it captures. */
#ifndef NCCL_SHIM_TEST_MOCK_CUDA_H
#define NCCL_SHIM_TEST_MOCK_CUDA_H
#include <cuda_runtime.h>

/* Runs fn(arg) now (then frees arg), or records it into the stream's capture (cudaGraphDestroy frees arg). */
void mock_stream_enqueue(cudaStream_t s, void (*fn)(void*), void* arg);
int mock_stream_capturing(cudaStream_t s);

#endif

/* All-reduce from C: braid's C API (braid/braid.h) and the CUDA runtime's C API, nothing else.
 *   braid-run -n 2 build/examples/example_c_all_reduce */
#include <braid/braid.h>
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK_BRAID(call)                                                                  \
  do {                                                                                     \
    braidResult_t result_ = (call);                                                        \
    if (result_ != braidSuccess) {                                                         \
      fprintf(stderr, "braid: %s: %s\n", braidGetErrorString(result_), braidGetLastError()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

#define CHECK_CUDA(call)                                                      \
  do {                                                                        \
    cudaError_t error_ = (call);                                              \
    if (error_ != cudaSuccess) {                                              \
      fprintf(stderr, "cuda: %s: %s\n", #call, cudaGetErrorString(error_));  \
      return 1;                                                               \
    }                                                                         \
  } while (0)

int main(void) {
  braidComm_t comm = NULL;
  CHECK_BRAID(braidCommInitFromEnv(&comm, -1)); /* the rendezvous braid-run (or torchrun, Slurm...) gives */
  int rank = 0, size = 0, device = 0;
  CHECK_BRAID(braidCommRank(comm, &rank));
  CHECK_BRAID(braidCommSize(comm, &size));
  CHECK_BRAID(braidCommDevice(comm, &device));
  CHECK_CUDA(cudaSetDevice(device));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  const size_t count = (size_t)1 << 20;
  float* host = (float*)malloc(count * sizeof(float));
  if (host == NULL) return 1;
  for (size_t i = 0; i < count; ++i) host[i] = (float)(rank + 1) + (float)(i % 7);
  float* data = NULL;
  CHECK_CUDA(cudaMalloc((void**)&data, count * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(data, host, count * sizeof(float), cudaMemcpyHostToDevice));

  CHECK_BRAID(braidAllReduce(comm, data, data, count, braidFloat32, braidSum, stream)); /* in place */
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_BRAID(braidCommCheck(comm)); /* a failure a kernel recorded (a peer that never came) */

  CHECK_CUDA(cudaMemcpy(host, data, count * sizeof(float), cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = (float)(size * (size + 1) / 2) + (float)(size * (int)(i % 7));
    wrong += host[i] != want;
  }
  printf("rank %d: all_reduce of %zu floats on %d ranks from C: %s\n", rank, count, size, wrong == 0 ? "OK" : "WRONG");
  CHECK_CUDA(cudaFree(data));
  CHECK_CUDA(cudaStreamDestroy(stream));
  free(host);
  CHECK_BRAID(braidCommDestroy(comm));
  return wrong == 0 ? 0 : 1;
}

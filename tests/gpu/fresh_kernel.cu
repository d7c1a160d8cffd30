#include "fresh_kernel.hpp"

namespace braid::testing {
namespace {

__global__ void fresh_kernel(int* data) { data[threadIdx.x] += 1; }

}  // namespace

cudaError_t launch_fresh_kernel(cudaStream_t stream, int* data) {
  fresh_kernel<<<1, 1, 0, stream>>>(data);
  return cudaGetLastError();
}

}  // namespace braid::testing

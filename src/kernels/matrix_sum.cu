#include "kernels/matrix_sum.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_check.hpp"
#include "core/kernel_modules.hpp"
#include "kernels/elementwise.cuh"

namespace braid::kernels {
namespace {

struct Summands {
  const void* sources[kMaxSummands];
};

constexpr int kSumThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kSumThreads) matrix_sum(T* destination, Summands summands, int count,
                                                          size_t elements) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < elements; i += stride) {
    float sum = 0.0f;
    for (int s = 0; s < count; ++s) sum += to_acc(static_cast<const T*>(summands.sources[s])[i]);
    destination[i] = from_acc<T>(sum);
  }
}

}  // namespace

void launch_matrix_sum(DataType type, void* destination, const void* const* sources, int count, size_t elements,
                       int max_blocks, cudaStream_t stream) {
  if (elements == 0) return;
  Summands summands{};
  for (int s = 0; s < count; ++s) summands.sources[s] = sources[s];
  const size_t wanted = (elements + kSumThreads - 1) / kSumThreads;
  const int blocks = static_cast<int>(wanted < size_t(max_blocks) ? wanted : size_t(max_blocks));
  if (type == DataType::kBFloat16) {
    matrix_sum<<<blocks, kSumThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(destination), summands, count, elements);
  } else {
    matrix_sum<<<blocks, kSumThreads, 0, stream>>>(static_cast<__half*>(destination), summands, count, elements);
  }
  BRAID_CUDA(cudaGetLastError());
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

#include "core/private_copy.hpp"

#include "core/cuda_check.hpp"

namespace braid::detail {

PrivateStream::PrivateStream() { BRAID_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

PrivateStream::~PrivateStream() { cudaStreamDestroy(stream_); }

void fill_zeros_now(void* destination, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  BRAID_CUDA(cudaMemsetAsync(destination, 0, bytes, stream));
  BRAID_CUDA(cudaStreamSynchronize(stream));
}

void copy_to_device_now(void* destination, const void* source, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  BRAID_CUDA(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyHostToDevice, stream));
  BRAID_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace braid::detail

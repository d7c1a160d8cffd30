#include "core/private_copy.hpp"

#include "core/cuda_check.hpp"

namespace braid::detail {

PrivateStream::PrivateStream() { BRAID_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

PrivateStream::~PrivateStream() { cudaStreamDestroy(stream_); }

void fill_zeros_now(void* destination, size_t bytes) {
  if (bytes == 0) return;
  PrivateStream stream;
  BRAID_CUDA(cudaMemsetAsync(destination, 0, bytes, stream.get()));
  BRAID_CUDA(cudaStreamSynchronize(stream.get()));
}

void copy_to_device_now(void* destination, const void* source, size_t bytes) {
  if (bytes == 0) return;
  PrivateStream stream;
  BRAID_CUDA(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyHostToDevice, stream.get()));
  BRAID_CUDA(cudaStreamSynchronize(stream.get()));
}

}  // namespace braid::detail

#include "core/private_copy.hpp"

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"

namespace braid::detail {
namespace {

// A non-blocking stream for one operation: it waits for no other stream, and nothing waits for it.
class PrivateStream {
 public:
  PrivateStream() { BRAID_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~PrivateStream() { cudaStreamDestroy(stream_); }
  PrivateStream(const PrivateStream&) = delete;
  PrivateStream& operator=(const PrivateStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace

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

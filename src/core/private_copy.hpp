// A private non-blocking stream, and fills and host-to-device copies that return when they have landed on one.
//
// NOTE [no device-wide waits]
// Ranks that share a GPU as threads of one process (BRAID_ALLOW_SHARED_GPU=1) share its CUDA context. There, a
// call that waits for the whole device (cudaDeviceSynchronize, cudaMemset, cudaMemcpy on the legacy default stream,
// which waits for every blocking stream and every thread's per-thread stream) also waits for a peer rank's kernel,
// and that kernel may spin until this rank joins a call it has not yet made: the two wait on each other until the
// timeout. So braid's own set-up work (symmetric memory, the sync pad, MoE buffers) goes through these helpers,
// which wait for nothing but their own work.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace braid::detail {

// A non-blocking stream of the current device for work that must run now: it waits for no other stream, nothing
// waits for it, and it is in no capture.
class PrivateStream {
 public:
  PrivateStream();
  ~PrivateStream();
  PrivateStream(const PrivateStream&) = delete;
  PrivateStream& operator=(const PrivateStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// bytes of zeros at device memory `destination` of the current device.
void fill_zeros_now(void* destination, size_t bytes);
// bytes from host memory `source` to device memory `destination` of the current device.
void copy_to_device_now(void* destination, const void* source, size_t bytes);

}  // namespace braid::detail

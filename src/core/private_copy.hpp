// A private non-blocking stream, and fills and host-to-device copies that return when they have landed on one.
//
// NOTE [streams made before the exchanges]
// Making a stream can wait for the whole device too: when the context's live streams reach certain counts (on
// H100 with driver R580, making the 36th, the 79th and the 122nd waited until a kernel running on another stream
// ended), the runtime grows its stream pool only once the GPU is idle. Where ranks share a GPU as threads, that
// kernel may be a peer's, spinning until this rank launches its part of a call. So a communicator makes every
// stream it keeps during init, before its last exchange with the peers, when no peer can yet be inside a call of
// it; and braid's set-up work (symmetric memory, the sync pad, MoE buffers, exposure tables), which may come after
// a peer's exchange has let it go on to its calls, runs on the one stream init made first for it
// (MemoryContext::setup_stream), never on a stream made for the occasion.
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

// bytes of zeros at device memory `destination` of the current device, on `stream` (a PrivateStream's).
void fill_zeros_now(void* destination, size_t bytes, cudaStream_t stream);
// bytes from host memory `source` to device memory `destination` of the current device, on `stream` (a
// PrivateStream's).
void copy_to_device_now(void* destination, const void* source, size_t bytes, cudaStream_t stream);

}  // namespace braid::detail

#include "collectives/call_buffers.hpp"

#include "collectives/kernels.hpp"
#include "comm/comm_state.hpp"
#include "core/capture_mode.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"

namespace braid::collectives {
namespace {

// A stream of its own, outside any capture, for work that must run now.
class OwnStream {
 public:
  OwnStream() { BRAID_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~OwnStream() { cudaStreamDestroy(stream_); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Every peer is about to exchange the same buffer, or this throws (kMismatch, or kTimeout when a peer never
// arrives) with the failure recorded for the whole communicator.
void agree_on_exchange(detail::CommState& state, Collective collective, ExchangedBuffer buffer, size_t bytes) {
  RelaxedCaptureMode relaxed;  // a capture may be running, here or in another rank's thread
  DeviceGuard guard(state.device);
  OwnStream stream;
  state.order->follow_eager(stream.get());  // the pad's counters where the communicator's eager calls left them
  kernels::launch_barrier(state.sync->pad(), static_cast<unsigned int>(collective), kSiteExchangeBarrier,
                          exchange_plan_word(collective, buffer, bytes), stream.get());
  BRAID_CUDA(cudaGetLastError());
  BRAID_CUDA(cudaStreamSynchronize(stream.get()));  // bounded: the barrier gives up at the communicator's timeout
  state.sync->raise_recorded_error(collective_name, describe_plan);
}

}  // namespace

std::optional<PeerRange> call_buffer_range(detail::CommState& state, Collective collective, ExchangedBuffer buffer,
                                           const void* pointer, size_t bytes) {
  return find_peer_range(state, pointer, bytes, [&] { agree_on_exchange(state, collective, buffer, bytes); });
}

}  // namespace braid::collectives

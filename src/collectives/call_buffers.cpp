#include "collectives/call_buffers.hpp"

#include "collectives/collective_context.hpp"
#include "collectives/kernels.hpp"
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

// What the barrier before an exchange announces: the call's collective, which buffer, its size.
struct Exchange {
  Collective collective;
  ExchangedBuffer buffer;
  size_t bytes;
};

// Every peer is about to exchange the same buffer, or this throws (kMismatch, or kTimeout when a peer never
// arrives) with the failure recorded for the whole communicator.
void agree_on_exchange(CollectiveContext& state, const Exchange& exchange) {
  const auto [collective, buffer, bytes] = exchange;
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

std::optional<PeerRange> call_buffer_range(CollectiveContext& state, Collective collective, ExchangedBuffer buffer,
                                           const void* pointer, size_t bytes) {
  // The hook captures two pointers, which std::function holds without allocating: every call builds it, and
  // few ever run it.
  const Exchange exchange{collective, buffer, bytes};
  CollectiveContext* const communicator = &state;
  const Exchange* const announced = &exchange;
  return find_peer_range(state, pointer, bytes,
                         [communicator, announced] { agree_on_exchange(*communicator, *announced); });
}

}  // namespace braid::collectives

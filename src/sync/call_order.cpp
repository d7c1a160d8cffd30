#include "sync/call_order.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"

namespace braid::detail {
namespace {

// cudaStreamPerThread names another stream in every host thread: never taken for the same stream.
bool same_stream(cudaStream_t a, cudaStream_t b) { return a == b && a != cudaStreamPerThread; }

}  // namespace

CallOrder::CallOrder(int device, cudaStream_t setup) : device_(device) {
  DeviceGuard guard(device_);
  BRAID_CUDA(cudaEventCreateWithFlags(&eager_done_, cudaEventDisableTiming));
  // Recorded once, so the wait node of a graph captured before any eager call waits on a recorded event: on the
  // set-up stream, never the legacy stream, which would make it wait for every blocking stream of the device, a
  // peer rank's waiting kernel among them where ranks share a GPU (NOTE [no device-wide waits]).
  try {
    BRAID_CUDA(cudaEventRecord(eager_done_, setup));
  } catch (...) {
    cudaEventDestroy(eager_done_);
    throw;
  }
}

CallOrder::~CallOrder() {
  DeviceGuard guard(device_);
  cudaEventDestroy(eager_done_);
}

CallOrder::Capture CallOrder::capture_of(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  Capture capture;
  // With the edges asked for too: a frontier of programmatic (dependent-launch) edges is not a lossy query.
  const cudaGraphEdgeData* edges = nullptr;
  BRAID_CUDA(cudaStreamGetCaptureInfo(stream, &status, &capture.id, &capture.graph, &capture.dependencies, &edges,
                                      &capture.dependency_count));
  if (status != cudaStreamCaptureStatusActive) return Capture{};
  return capture;
}

bool CallOrder::begin(cudaStream_t stream) {
  const Capture capture = capture_of(stream);
  call_graph_ = capture.graph;
  forget_ended_captures(stream, capture.id);
  if (capture.id == 0) {
    begin_eager(stream);
    return false;
  }
  begin_captured(stream, capture);
  return true;
}

void CallOrder::begin_eager(cudaStream_t stream) {
  const bool after_eager_elsewhere = last_eager_stream_.has_value() && !same_stream(stream, *last_eager_stream_);
  // After a capture with braid calls, a replay launched on any stream may have run since the last call.
  if (graphs_made_ || after_eager_elsewhere) BRAID_CUDA(cudaStreamWaitEvent(stream, eager_done_, 0));
}

void CallOrder::begin_captured(cudaStream_t stream, const Capture& capture) {
  CaptureChain* chain = find_chain(capture.id);
  if (chain == nullptr) {
    // The first call of this capture: every replay waits for the work before its launch.
    BRAID_CUDA(cudaStreamWaitEvent(stream, eager_done_, cudaEventWaitExternal));
    chain = &start_chain(capture.id);
  } else if (!same_stream(stream, chain->last_stream) && !chain->last_call_end.empty()) {
    // Edges from the end of the capture's previous call, whatever the communicator did since (NOTE [a chain per
    // capture]).
    BRAID_CUDA(cudaStreamUpdateCaptureDependencies(stream, chain->last_call_end.data(), nullptr,
                                                   chain->last_call_end.size(), cudaStreamAddCaptureDependencies));
  }
  chain->last_call = ++calls_;
}

void CallOrder::end(cudaStream_t stream, bool captured) {
  call_graph_ = nullptr;
  const Capture capture = captured ? capture_of(stream) : Capture{};
  if (capture.id == 0) {
    BRAID_CUDA(cudaEventRecord(eager_done_, stream));
    last_eager_stream_ = stream;
  } else {
    end_captured(stream, capture);
  }
}

void CallOrder::end_captured(cudaStream_t stream, const Capture& capture) {
  graphs_made_ = true;
  // Copied first: the array lives until the next call on the stream.
  std::vector<cudaGraphNode_t> call_end(capture.dependencies, capture.dependencies + capture.dependency_count);
  CaptureChain* found = find_chain(capture.id);
  CaptureChain& chain = found != nullptr ? *found : start_chain(capture.id);  // begin started it, unless pushed out
  move_record_node(chain, capture.graph, call_end);
  chain.last_stream = stream;
  chain.last_call_end = std::move(call_end);
}

void CallOrder::move_record_node(CaptureChain& chain, cudaGraph_t graph, const std::vector<cudaGraphNode_t>& call_end) {
  // One record node a capture, off the stream's chain, after the work of the capture's latest call: nothing
  // captured later waits for it, and a replay records the event once, after its last braid call. Each call moves
  // the node's dependencies to its own frontier (the earlier calls precede it), so no earlier kernel keeps a
  // second successor, which would cost each of them the graph's fast kernel-to-kernel launch.
  if (chain.record == nullptr) {
    BRAID_CUDA(cudaGraphAddEventRecordNode(&chain.record, graph, nullptr, 0, eager_done_));
  }
  for (cudaGraphNode_t before : chain.last_call_end) {
    // Where CUDA keeps an edge, the node still follows that earlier call's work: correct, only slower. The error
    // is taken off the thread so that no launch check reads it as its own.
    if (cudaGraphRemoveDependencies(graph, &before, &chain.record, nullptr, 1) != cudaSuccess) cudaGetLastError();
  }
  for (cudaGraphNode_t before : call_end) {
    BRAID_CUDA(cudaGraphAddDependencies(graph, &before, &chain.record, nullptr, 1));
  }
}

CallOrder::CaptureChain* CallOrder::find_chain(unsigned long long capture_id) {
  const auto found = std::find_if(chains_.begin(), chains_.end(),
                                  [capture_id](const CaptureChain& chain) { return chain.capture_id == capture_id; });
  return found == chains_.end() ? nullptr : &*found;
}

CallOrder::CaptureChain& CallOrder::start_chain(unsigned long long capture_id) {
  if (chains_.size() >= kMaxCaptureChains) {
    const auto by_latest_call = [](const CaptureChain& a, const CaptureChain& b) { return a.last_call < b.last_call; };
    chains_.erase(std::min_element(chains_.begin(), chains_.end(), by_latest_call));
  }
  CaptureChain& chain = chains_.emplace_back();
  chain.capture_id = capture_id;
  chain.last_call = calls_;
  return chain;
}

void CallOrder::forget_ended_captures(cudaStream_t stream, unsigned long long capture_id) {
  if (stream == cudaStreamPerThread) return;  // another stream in each thread: it tells nothing of the others'
  // A stream stays in its capture until the capture ends: one now outside it shows the capture ended.
  std::erase_if(chains_, [stream, capture_id](const CaptureChain& chain) {
    return chain.last_stream == stream && chain.capture_id != capture_id;
  });
}

void CallOrder::follow_eager(cudaStream_t stream) { BRAID_CUDA(cudaStreamWaitEvent(stream, eager_done_, 0)); }

bool CallOrder::wait_for_calls(double timeout_s) {
  DeviceGuard guard(device_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const cudaError_t state = cudaEventQuery(eager_done_);
    if (state == cudaSuccess) return true;
    if (state != cudaErrorNotReady) BRAID_CUDA(state);
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

CallOrder::Scope::~Scope() noexcept(false) {
  if (std::uncaught_exceptions() > 0) {
    try {
      order_.end(stream_, captured_);
    } catch (...) {
      // the call's own error is on its way; this one would only hide it
    }
    return;
  }
  order_.end(stream_, captured_);
}

}  // namespace braid::detail

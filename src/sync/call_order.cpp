#include "sync/call_order.hpp"

#include <exception>

#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"

namespace braid::detail {

CallOrder::CallOrder(int device) : device_(device) {
  DeviceGuard guard(device_);
  BRAID_CUDA(cudaEventCreateWithFlags(&eager_done_, cudaEventDisableTiming));
  if (cudaError_t error = cudaEventCreateWithFlags(&captured_done_, cudaEventDisableTiming); error != cudaSuccess) {
    cudaEventDestroy(eager_done_);
    BRAID_CUDA(error);
  }
  // Recorded once, so the wait node of a graph captured before any eager call waits on a recorded event.
  if (cudaError_t error = cudaEventRecord(eager_done_, cudaStreamLegacy); error != cudaSuccess) {
    cudaEventDestroy(eager_done_);
    cudaEventDestroy(captured_done_);
    BRAID_CUDA(error);
  }
}

CallOrder::~CallOrder() {
  DeviceGuard guard(device_);
  cudaEventDestroy(eager_done_);
  cudaEventDestroy(captured_done_);
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
  // cudaStreamPerThread names another stream in every host thread: never taken for the same stream.
  const bool same_stream = stream == last_stream_ && stream != cudaStreamPerThread;
  if (capture.id == 0) {
    // After a capture with braid calls, a replay launched on any stream may have run since the last call.
    if (any_call_ && (graphs_made_ || !same_stream)) {
      BRAID_CUDA(cudaStreamWaitEvent(stream, eager_done_, 0));
    }
    return false;
  }
  if (capture.id == last_capture_) {
    if (!same_stream) BRAID_CUDA(cudaStreamWaitEvent(stream, captured_done_, 0));
    return true;
  }
  // The first call of this capture: every replay waits for the work before its launch.
  BRAID_CUDA(cudaStreamWaitEvent(stream, eager_done_, cudaEventWaitExternal));
  last_record_ = nullptr;
  return true;
}

void CallOrder::end(cudaStream_t stream, bool captured) {
  call_graph_ = nullptr;
  const Capture capture = captured ? capture_of(stream) : Capture{};
  if (capture.id == 0) {
    BRAID_CUDA(cudaEventRecord(eager_done_, stream));
  } else {
    BRAID_CUDA(cudaEventRecord(captured_done_, stream));
    // One record node a capture, off the stream's chain, after the work of the capture's latest call: nothing
    // captured later waits for it, and a replay records the event once, after its last braid call. Each call
    // moves the node's dependencies to its own frontier (the earlier calls precede it), so no earlier kernel
    // keeps a second successor, which would cost each of them the graph's fast kernel-to-kernel launch.
    if (last_record_ == nullptr || capture.id != last_capture_) {
      BRAID_CUDA(cudaGraphAddEventRecordNode(&last_record_, capture.graph, nullptr, 0, eager_done_));
      record_after_.clear();
    }
    for (cudaGraphNode_t before : record_after_) {
      // Where CUDA keeps an edge, the node still follows that earlier call's work: correct, only slower. The
      // error is taken off the thread so that no launch check reads it as its own.
      if (cudaGraphRemoveDependencies(capture.graph, &before, &last_record_, nullptr, 1) != cudaSuccess) {
        cudaGetLastError();
      }
    }
    record_after_.assign(capture.dependencies, capture.dependencies + capture.dependency_count);
    for (cudaGraphNode_t before : record_after_) {
      BRAID_CUDA(cudaGraphAddDependencies(capture.graph, &before, &last_record_, nullptr, 1));
    }
    graphs_made_ = true;
  }
  any_call_ = true;
  last_stream_ = stream;
  last_capture_ = capture.id;
}

void CallOrder::follow_eager(cudaStream_t stream) { BRAID_CUDA(cudaStreamWaitEvent(stream, eager_done_, 0)); }

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

// Small owners of CUDA objects and helpers shared by braid-bench's runs (bench.cpp, the moe_*.cpp files): a checked
// CUDA call, a stream, events, a captured graph of back-to-back calls, device and pinned memory, the median of
// timings, and the timing loop.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/braid.hpp"

namespace braid::bench {

inline void cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(result) + " (" +
                             cudaGetErrorString(result) + ")");
  }
}

using Call = std::function<void(cudaStream_t)>;

class StreamHandle {
 public:
  StreamHandle() { cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~StreamHandle() {
    // Not on failure: a kernel may be waiting for a peer that already gave up, and would hold the stream.
    if (std::uncaught_exceptions() == 0) cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Events {
 public:
  explicit Events(int count) : events_(count, nullptr) {
    for (cudaEvent_t& event : events_) cuda(cudaEventCreate(&event), "cudaEventCreate");
  }
  ~Events() {
    for (cudaEvent_t event : events_) {
      if (event != nullptr) cudaEventDestroy(event);
    }
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t operator[](int i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

// A captured and instantiated graph of back-to-back calls.
class Graph {
 public:
  Graph(cudaStream_t stream, const Call& call, int calls) {
    // Thread-local capture: ranks that are threads capture at once, and a peer thread's unrelated CUDA calls
    // must not invalidate this capture.
    cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      for (int i = 0; i < calls; ++i) call(stream);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);  // leave the stream usable
      if (broken != nullptr) cudaGraphDestroy(broken);
      throw;
    }
    cuda(cudaStreamEndCapture(stream, &graph_), "cudaStreamEndCapture");
    cuda(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  ~Graph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void launch(cudaStream_t stream) const { cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch"); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Owners of device memory and pinned host memory, not freed while unwinding from a failure.
class DeviceMemory {  // cudaMalloc'd
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(std::max<size_t>(bytes, 256)) {
    cuda(cudaMalloc(&data_, bytes_), "cudaMalloc");
  }
  ~DeviceMemory() {
    // Unwinding from a failure: cudaFree would wait for kernels that may spin on a dead peer.
    if (std::uncaught_exceptions() == 0) cudaFree(data_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedMemory {
 public:
  explicit PinnedMemory(size_t bytes) { cuda(cudaMallocHost(&data_, std::max<size_t>(bytes, 8)), "cudaMallocHost"); }
  ~PinnedMemory() {
    if (std::uncaught_exceptions() == 0) cudaFreeHost(data_);
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  template <typename T>
  T* get() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}


// How a row is timed: warm-up calls, then `repeats` repetitions of `iters` calls (as replays of a graph of
// `graph_calls` calls when graph_calls > 0), each repetition between two events.
struct TimingPlan {
  int warmup;
  int iters;
  int repeats;
  int graph_calls;
  bool blocking;  // the host waits for each call (or graph replay) inside the timed region (-z 1)
};

// Per-call time of this rank, in microseconds: the median over repetitions. Collective (host barriers).
inline double time_calls(Communicator& comm, cudaStream_t stream, const Call& call, const TimingPlan& plan) {
  // A rank still checking its last output keeps the others here, not spinning on the GPU in their warm-up calls.
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  comm.barrier();
  for (int i = 0; i < plan.warmup; ++i) call(stream);
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::unique_ptr<Graph> graph;
  int launches = plan.iters, calls = plan.iters;
  if (plan.graph_calls > 0) {
    graph = std::make_unique<Graph>(stream, call, plan.graph_calls);
    // Instantiation waits for every kernel of the context: where ranks share a GPU as threads, a peer's replay
    // already spinning for this rank would hold it there until the timeout (docs/shared-gpu.md).
    comm.barrier();
    graph->launch(stream);  // the first launch uploads the graph: untimed
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    launches = (plan.iters + plan.graph_calls - 1) / plan.graph_calls;
    calls = launches * plan.graph_calls;
  }
  Events starts(plan.repeats), stops(plan.repeats);
  for (int repeat = 0; repeat < plan.repeats; ++repeat) {
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    comm.barrier();
    call(stream);  // untimed: it waits for the last rank out of the barrier, so the timed calls start together
    cuda(cudaEventRecord(starts[repeat], stream), "cudaEventRecord");
    for (int i = 0; i < launches; ++i) {
      if (graph) {
        graph->launch(stream);
      } else {
        call(stream);
      }
      if (plan.blocking) cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    cuda(cudaEventRecord(stops[repeat], stream), "cudaEventRecord");
  }
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  comm.check();
  std::vector<double> per_call;
  for (int repeat = 0; repeat < plan.repeats; ++repeat) {
    float ms = 0;
    cuda(cudaEventElapsedTime(&ms, starts[repeat], stops[repeat]), "cudaEventElapsedTime");
    per_call.push_back(static_cast<double>(ms) * 1000.0 / calls);
  }
  return median(per_call);
}

}  // namespace braid::bench

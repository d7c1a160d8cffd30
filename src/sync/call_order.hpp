// A communicator's calls run in the order they were made, whatever stream each one names (NCCL's rule,
// DESIGN.md rule 8): call k+1 starts on the GPU only after call k's work is done, so no call touches a slot,
// flag or counter of the call before it while that call still uses it.
//
// The work of a call is enqueued on the caller's stream; CallOrder joins that stream to the previous call:
//   - eager after eager: a wait on the event recorded after the previous call, only when the stream differs
//     (one stream needs nothing: CUDA orders it);
//   - captured after captured in the same capture: the same, inside the graph (an edge, no node);
//   - the first call of a capture: an external event-wait node on the communicator's last eager work, so every
//     replay of the graph runs after the calls made before it was launched;
//   - a capture holds one event-record node, off the stream's chain, after the work of its latest call (which
//     follows the earlier ones), so eager calls made after a replay was launched wait for the replay's braid
//     calls; once a graph with braid calls exists, every eager call waits on that event, whatever its stream.
// A communicator is driven by one host thread at a time, as in NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "core/device_guard.hpp"

namespace braid::detail {

class CallOrder {
 public:
  explicit CallOrder(int device);
  ~CallOrder();
  CallOrder(const CallOrder&) = delete;
  CallOrder& operator=(const CallOrder&) = delete;

  // Orders the work about to be enqueued on `stream` after every earlier call of the communicator. Returns
  // whether the stream is being captured (what end() is told).
  bool begin(cudaStream_t stream);
  // Marks the end of the call begun on `stream`: what the next call waits for.
  void end(cudaStream_t stream, bool captured);
  // Orders what is enqueued on `stream` from now on after every eager call made so far (and every replay
  // launched so far of a graph with the communicator's calls). For work that runs outside the call order, at
  // once, while a call is being made or captured.
  void follow_eager(cudaStream_t stream);
  // The graph the call in progress (between begin and end) is being captured into; null for an eager call.
  cudaGraph_t call_graph() const { return call_graph_; }

  // The scope of one call, with the communicator's GPU current: begin at construction, end at destruction
  // (also when the call throws after enqueuing part of its work, so the next call still waits for that part).
  class Scope {
   public:
    Scope(CallOrder& order, int device, cudaStream_t stream)
        : guard_(device), order_(order), stream_(stream), captured_(order_.begin(stream_)) {}
    ~Scope() noexcept(false);
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    DeviceGuard guard_;
    CallOrder& order_;
    cudaStream_t stream_;
    bool captured_;
  };

 private:
  struct Capture {
    unsigned long long id = 0;      // 0: not capturing
    cudaGraph_t graph = nullptr;
    const cudaGraphNode_t* dependencies = nullptr;
    size_t dependency_count = 0;
  };
  static Capture capture_of(cudaStream_t stream);

  int device_;
  cudaEvent_t eager_done_ = nullptr;     // after the last eager call, or the last captured call of a replay
  cudaEvent_t captured_done_ = nullptr;  // after the last call of the current capture (inside that capture)
  bool any_call_ = false;
  cudaStream_t last_stream_ = nullptr;
  unsigned long long last_capture_ = 0;  // capture id of the last call; 0 when it was eager
  cudaGraph_t call_graph_ = nullptr;     // call_graph()
  cudaGraphNode_t last_record_ = nullptr;  // the current capture's record node
  bool graphs_made_ = false;                   // a capture holds braid calls: eager calls always wait
  std::vector<cudaGraphNode_t> record_after_;  // what the record node depends on: the latest call's frontier
};

}  // namespace braid::detail

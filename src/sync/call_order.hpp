// A communicator's calls run in the order they were made, whatever stream each one names (NCCL's rule):
// call k+1 starts on the GPU only after call k's work is done, so no call touches a slot,
// flag or counter of the call before it while that call still uses it.
//
// The work of a call is enqueued on the caller's stream; CallOrder joins that stream to the previous call:
//   - eager after eager: a wait on the event recorded after the previous eager call, only when the stream
//     differs (one stream needs nothing: CUDA orders it);
//   - captured after captured in the same capture: inside the graph, edges from the nodes that end the capture's
//     previous call (no node), only when the stream differs;
//   - the first call of a capture: an external event-wait node on the communicator's last eager work, so every
//     replay of the graph runs after the calls made before it was launched;
//   - a capture holds one event-record node, off the stream's chain, after the work of its latest call (which
//     follows the earlier ones), so eager calls made after a replay was launched wait for the replay's braid
//     calls; once a graph with braid calls exists, every eager call waits on that event, whatever its stream.
// A communicator is driven by one host thread at a time, as in NCCL.
//
// NOTE [a chain per capture]
// Each capture keeps its own chain, found by its capture id: the stream of its latest call, the nodes that end
// that call's work, and its record node. An eager call, or a call of another capture (two captures of one
// communicator may be open at once), made between two calls of a capture leaves that capture's chain as it was:
// the later call still follows the earlier one inside the graph, and the graph keeps one external wait node and
// one record node. A chain is forgotten once its capture is seen to have ended: a call names the stream of the
// chain's latest call and that stream is no longer in the capture (a stream stays in a capture until the capture
// ends; the streams of ended captures may be destroyed, so none is asked about but the call's own). Chains whose
// last stream is never named again are forgotten oldest first (by latest call) beyond kMaxCaptureChains. So a
// capture loses its chain only when, between two of its calls, that many other captures of the communicator
// begin on streams that no later call names: its next call would then start a new chain, with no edge from the
// calls before. A chain holds no CUDA resource: forgetting one frees nothing on the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/device_guard.hpp"

namespace braid::detail {

class CallOrder {
 public:
  // `setup` is the communicator's set-up stream (MemoryContext::setup_stream), which records the first event.
  CallOrder(int device, cudaStream_t setup);
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
  // Waits until every eager call made so far, and every replay launched so far of a graph with the
  // communicator's calls, has completed on the GPU; false where timeout_s passed first.
  bool wait_for_calls(double timeout_s);
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
  static constexpr size_t kMaxCaptureChains = 64;  // NOTE [a chain per capture]

  struct Capture {
    unsigned long long id = 0;  // 0: not capturing
    cudaGraph_t graph = nullptr;
    const cudaGraphNode_t* dependencies = nullptr;  // valid until the next call on the stream
    size_t dependency_count = 0;
  };
  // One capture's calls so far (NOTE [a chain per capture]).
  struct CaptureChain {
    unsigned long long capture_id = 0;
    cudaStream_t last_stream = nullptr;          // of the capture's latest call
    std::vector<cudaGraphNode_t> last_call_end;  // the stream's dependencies after that call's work
    cudaGraphNode_t record = nullptr;            // the capture's record node of eager_done_; null before its first end
    uint64_t last_call = 0;                      // calls_ at the latest call: the oldest goes first
  };
  static Capture capture_of(cudaStream_t stream);

  void begin_eager(cudaStream_t stream);
  void begin_captured(cudaStream_t stream, const Capture& capture);
  void end_captured(cudaStream_t stream, const Capture& capture);
  // Moves the chain's record node (made at the end of the capture's first call) from after the end of the
  // capture's previous call to after `call_end`, the end of its latest.
  void move_record_node(CaptureChain& chain, cudaGraph_t graph, const std::vector<cudaGraphNode_t>& call_end);
  CaptureChain* find_chain(unsigned long long capture_id);
  // A chain for a capture's first call; the chain with the oldest latest call goes when kMaxCaptureChains are kept.
  CaptureChain& start_chain(unsigned long long capture_id);
  // Forgets the chains of captures that ended, as `stream` (now in capture `capture_id`, or in none: 0) shows.
  void forget_ended_captures(cudaStream_t stream, unsigned long long capture_id);

  int device_;
  cudaEvent_t eager_done_ = nullptr;               // after the last eager call, or the last captured call of a replay
  std::optional<cudaStream_t> last_eager_stream_;  // of the last eager call; none before the first
  bool graphs_made_ = false;                       // a capture holds braid calls: eager calls always wait
  cudaGraph_t call_graph_ = nullptr;               // call_graph()
  std::vector<CaptureChain> chains_;               // open captures (and some ended ones not yet seen ended)
  uint64_t calls_ = 0;                             // captured calls begun so far
};

}  // namespace braid::detail

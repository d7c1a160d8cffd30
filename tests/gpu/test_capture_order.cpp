// The calls of one capture stay ordered inside its graph whatever the communicator does between them
// (sync/call_order.hpp, NOTE [a chain per capture]), on every rank (threads or braid-run processes).
//
// The shape: a capture begun on S0 forks S1 and S2; a marker kernel M1 and an all_reduce X1 on S1, then something
// between, then an all_reduce X2 and a marker M2 on S2; S1 and S2 join S0 and the capture ends. Walking the graph's
// edges (with their data: braid's programmatic edges fail a query without it), M1 must be an ancestor of M2, and
// the graph must hold one external event-wait node (the first call's) and one event-record node, after X2's work.
// Between X1 and X2:
//   - nothing; the caller's own event ordering X2's stream after X1's (CallOrder's edges then repeat the caller's);
//   - an eager all_reduce, put, get or MoE dispatch of the communicator on an uncaptured stream;
//   - a call of a second capture of the communicator, begun before X1 and ended after X2 (its graph is checked
//     the same way).
// Also: two captures at once, each with two calls on two forked streams, interleaved; one capture open while 200
// others begin and end on one stream; 200 captures on fresh streams, each with an eager call between its two; and
// 200 replays of the eager-between graph with X2 reading what X1 wrote, checked against the host every replay.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "braid/braid.hpp"
#include "braid/moe.hpp"
#include "collective_reference.hpp"
#include "spin_kernel.hpp"
#include "test_helpers.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr size_t kCount = 256;  // int32 elements of each call: an LL size, so capturing one exchanges nothing
constexpr int kManyCaptures = 200;  // beyond the chains CallOrder keeps (kMaxCaptureChains)

class Event {
 public:
  Event() { cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// A relaxed-mode capture begun on `origin` (the eager calls between captured ones, and the other ranks' threads,
// go on meanwhile), with the streams forked from it joined back at end().
class Capture {
 public:
  explicit Capture(cudaStream_t origin) : origin_(origin) {
    cuda_check(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  }
  ~Capture() {
    if (capturing_) {  // a failed test: leave the stream usable
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(origin_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  // `to` waits for what is enqueued on `from` so far: inside the capture, `to` forks from `from` or joins it.
  void follow(cudaStream_t to, cudaStream_t from) {
    cuda_check(cudaEventRecord(event_.get(), from), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(to, event_.get(), 0), "cudaStreamWaitEvent");
  }
  void fork(cudaStream_t stream) {
    follow(stream, origin_);
    forked_.push_back(stream);
  }
  cudaGraph_t end() {
    for (cudaStream_t stream : forked_) follow(origin_, stream);
    capturing_ = false;
    cuda_check(cudaStreamEndCapture(origin_, &graph_), "cudaStreamEndCapture");
    return graph_;
  }

 private:
  cudaStream_t origin_;
  Event event_;
  std::vector<cudaStream_t> forked_;
  bool capturing_ = true;
  cudaGraph_t graph_ = nullptr;
};

// The nodes the next node captured on `stream` will depend on.
std::vector<cudaGraphNode_t> capture_frontier(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* nodes = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t count = 0;
  cuda_check(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &nodes, &edges, &count),
             "cudaStreamGetCaptureInfo");
  if (status != cudaStreamCaptureStatusActive) {
    throw std::runtime_error("capture_frontier: the stream is not capturing");
  }
  return {nodes, nodes + count};
}

// Captures a marker kernel (spinning `nanoseconds`) on `stream`; returns its node.
cudaGraphNode_t marker(cudaStream_t stream, uint32_t nanoseconds = 0) {
  cuda_check(spin_on_stream(stream, nanoseconds), "marker kernel");
  const std::vector<cudaGraphNode_t> frontier = capture_frontier(stream);
  if (frontier.size() != 1) throw std::runtime_error("marker: the stream's frontier is not the marker alone");
  return frontier[0];
}

// A graph's nodes and edges, as cudaGraphGetNodes and cudaGraphGetEdges (with edge data) give them.
class GraphShape {
 public:
  explicit GraphShape(cudaGraph_t graph) {
    size_t node_count = 0;
    cuda_check(cudaGraphGetNodes(graph, nullptr, &node_count), "cudaGraphGetNodes (count)");
    nodes_.resize(node_count);
    if (node_count != 0) cuda_check(cudaGraphGetNodes(graph, nodes_.data(), &node_count), "cudaGraphGetNodes");
    size_t edge_count = 0;
    cuda_check(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count), "cudaGraphGetEdges (count)");
    if (edge_count == 0) return;
    std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
    std::vector<cudaGraphEdgeData> data(edge_count);
    cuda_check(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edge_count), "cudaGraphGetEdges");
    for (size_t i = 0; i < edge_count; ++i) predecessors_[to[i]].push_back(from[i]);
  }

  // Whether a path of edges leads from `before` to `after`.
  bool precedes(cudaGraphNode_t before, cudaGraphNode_t after) const {
    std::vector<cudaGraphNode_t> pending{after};
    std::unordered_map<cudaGraphNode_t, bool> seen{{after, true}};
    while (!pending.empty()) {
      const cudaGraphNode_t node = pending.back();
      pending.pop_back();
      const auto found = predecessors_.find(node);
      if (found == predecessors_.end()) continue;
      for (cudaGraphNode_t predecessor : found->second) {
        if (predecessor == before) return true;
        if (seen.emplace(predecessor, true).second) pending.push_back(predecessor);
      }
    }
    return false;
  }

  std::vector<cudaGraphNode_t> nodes_of(cudaGraphNodeType type) const {
    std::vector<cudaGraphNode_t> found;
    for (cudaGraphNode_t node : nodes_) {
      cudaGraphNodeType node_type;
      cuda_check(cudaGraphNodeGetType(node, &node_type), "cudaGraphNodeGetType");
      if (node_type == type) found.push_back(node);
    }
    return found;
  }

 private:
  std::vector<cudaGraphNode_t> nodes_;
  std::unordered_map<cudaGraphNode_t, std::vector<cudaGraphNode_t>> predecessors_;
};

// What a capture must show of two calls: `first_marker` (before the first call) is an ancestor of `second_marker`
// (after the second), and the graph holds one external event-wait node and one event-record node, which follows
// `last_call_end` (the capture stream's frontier right after the second call). Returns whether all of it held.
bool expect_ordered_pair(cudaGraph_t graph, cudaGraphNode_t first_marker, cudaGraphNode_t second_marker,
                         const std::vector<cudaGraphNode_t>& last_call_end, int rank, const std::string& what) {
  const GraphShape shape(graph);
  bool held = true;
  if (!shape.precedes(first_marker, second_marker)) {
    held = false;
    ADD_FAILURE() << "rank " << rank << ", " << what << ": the marker before the first call is no ancestor of the "
                  << "marker after the second: the capture's second call does not follow its first";
  }
  const size_t waits = shape.nodes_of(cudaGraphNodeTypeWaitEvent).size();
  if (waits != 1) {
    held = false;
    ADD_FAILURE() << "rank " << rank << ", " << what << ": " << waits << " external event-wait nodes; one expected "
                  << "(the capture's first call's)";
  }
  const std::vector<cudaGraphNode_t> records = shape.nodes_of(cudaGraphNodeTypeEventRecord);
  if (records.size() != 1) {
    ADD_FAILURE() << "rank " << rank << ", " << what << ": " << records.size() << " event-record nodes; one expected";
    return false;
  }
  for (cudaGraphNode_t node : last_call_end) {
    if (!shape.precedes(node, records[0])) {
      held = false;
      ADD_FAILURE() << "rank " << rank << ", " << what << ": the record node does not follow the work of the "
                    << "capture's latest call";
    }
  }
  return held;
}

void all_reduce(Communicator& comm, const DeviceBuffer& send, const DeviceBuffer& recv, cudaStream_t stream) {
  comm.all_reduce(send.get(), recv.get(), kCount, DataType::kInt32, ReduceOp::kSum, stream);
}

// Enqueues `call`, an eager call on `stream` between two calls of a capture, once every rank is set up, and waits
// for it. Where ranks share a GPU as threads, a rank still allocating or beginning its capture (which waits for
// every kernel of the context) would hold back a peer's call that spins for it until the timeout: every rank gets
// here before any launches, and its call is done before it goes on to calls that wait for the context (NOTE
// [shared-GPU waits] in world.hpp).
template <typename Call>
void eager_call_between(cudaStream_t stream, Call&& call) {
  host_barrier();
  call();
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// What the communicator does between X1 and X2.
enum class Between {
  kNothing,
  kCallersEvent,  // X2's stream waits for X1's through the caller's own event: the edges are there already
  kEagerAllReduce,
  kEagerPut,
  kEagerGet,
  kEagerMoeDispatch,
  kCallOfAnotherCapture,
};

// The eager calls between X1 and X2, with what they use made beforehand (collective, or allocating: never inside a
// capture).
class EagerCallBetween {
 public:
  EagerCallBetween(Communicator& comm, Between kind) : comm_(comm), kind_(kind), send_(kCount * 4), recv_(kCount * 4) {
    cuda_check(cudaMemset(send_.get(), 1, kCount * 4), "cudaMemset");
    if (kind_ == Between::kEagerPut || kind_ == Between::kEagerGet) {
      global_ = comm_.import_global(export_handle(recv_.get(), kCount * 4));
    }
    if (kind_ == Between::kEagerMoeDispatch) make_moe();
  }

  // Runs the call on `stream`, which no capture holds, and waits for it (eager_call_between).
  void run(cudaStream_t stream) {
    eager_call_between(stream, [&] {
      switch (kind_) {
        case Between::kEagerAllReduce: all_reduce(comm_, send_, recv_, stream); break;
        case Between::kEagerPut: comm_.put(global_, comm_.rank(), 0, send_.get(), kCount * 4, stream); break;
        case Between::kEagerGet: comm_.get(global_, comm_.rank(), 0, send_.get(), kCount * 4, stream); break;
        case Between::kEagerMoeDispatch:
          (void)moe_->dispatch(tokens_->get(), expert_ids_->get(), static_cast<const float*>(weights_->get()), 1,
                               nullptr, stream);
          break;
        default: break;
      }
    });
  }

 private:
  // One float32 token of 8 elements a rank, to the rank's own expert.
  void make_moe() {
    MoeShape shape;
    shape.hidden = 8;
    shape.type = DataType::kFloat32;
    shape.index_type = DataType::kInt64;
    shape.max_tokens = 1;
    shape.top_k = 1;
    shape.experts = comm_.size();
    moe_.emplace(MoeBuffer::create(comm_, shape));
    tokens_ = std::make_unique<DeviceBuffer>(shape.hidden * 4);
    expert_ids_ = std::make_unique<DeviceBuffer>(8);
    weights_ = std::make_unique<DeviceBuffer>(4);
    const std::vector<float> token(shape.hidden, 1.5f);
    const int64_t expert = comm_.rank();
    const float weight = 1.0f;
    cuda_check(cudaMemcpy(tokens_->get(), token.data(), shape.hidden * 4, cudaMemcpyHostToDevice), "upload token");
    cuda_check(cudaMemcpy(expert_ids_->get(), &expert, 8, cudaMemcpyHostToDevice), "upload expert id");
    cuda_check(cudaMemcpy(weights_->get(), &weight, 4, cudaMemcpyHostToDevice), "upload weight");
  }

  Communicator& comm_;
  Between kind_;
  DeviceBuffer send_, recv_;
  GlobalMemory global_;
  std::optional<MoeBuffer> moe_;
  std::unique_ptr<DeviceBuffer> tokens_, expert_ids_, weights_;
};

// The shape of the file's comment with `between` between X1 and X2, checked on every rank.
void expect_calls_ordered_across(Between between, const std::string& what) {
  with_communicator([between, &what](Communicator& comm) {
    EagerCallBetween eager_call(comm, between);
    DeviceBuffer send(kCount * 4), first(kCount * 4), second(kCount * 4), other(kCount * 4);
    StreamHandle s0, s1, s2, uncaptured, other_origin;
    std::optional<Capture> other_capture;
    cudaGraphNode_t other_marker = nullptr;
    {
      Capture capture(s0.get());
      capture.fork(s1.get());
      capture.fork(s2.get());
      if (between == Between::kCallOfAnotherCapture) {
        other_capture.emplace(other_origin.get());
        other_marker = marker(other_origin.get());
      }
      const cudaGraphNode_t m1 = marker(s1.get());
      all_reduce(comm, send, first, s1.get());  // X1
      if (between == Between::kCallOfAnotherCapture) {
        all_reduce(comm, send, other, other_origin.get());
      } else if (between == Between::kCallersEvent) {
        capture.follow(s2.get(), s1.get());
      } else {
        eager_call.run(uncaptured.get());
      }
      all_reduce(comm, first, second, s2.get());  // X2
      const std::vector<cudaGraphNode_t> x2_end = capture_frontier(s2.get());
      const cudaGraphNode_t m2 = marker(s2.get());
      std::vector<cudaGraphNode_t> other_end;
      if (other_capture) {
        other_end = capture_frontier(other_origin.get());
        const cudaGraphNode_t other_last = marker(other_origin.get());
        expect_ordered_pair(other_capture->end(), other_marker, other_last, other_end, comm.rank(),
                            what + " (the other capture)");
      }
      expect_ordered_pair(capture.end(), m1, m2, x2_end, comm.rank(), what);
    }
    cuda_check(cudaStreamSynchronize(uncaptured.get()), "cudaStreamSynchronize");
    comm.check();
  });
}

TEST(CaptureOrder, CallsOnTwoForkedStreamsAreOrdered) {
  expect_calls_ordered_across(Between::kNothing, "nothing between");
}

TEST(CaptureOrder, CallsOrderedByTheCallerToo) {
  expect_calls_ordered_across(Between::kCallersEvent, "the caller's own event between");
}

TEST(CaptureOrder, EagerAllReduceBetweenKeepsTheChain) {
  expect_calls_ordered_across(Between::kEagerAllReduce, "an eager all_reduce between");
}

TEST(CaptureOrder, EagerPutBetweenKeepsTheChain) {
  expect_calls_ordered_across(Between::kEagerPut, "an eager put between");
}

TEST(CaptureOrder, EagerGetBetweenKeepsTheChain) {
  expect_calls_ordered_across(Between::kEagerGet, "an eager get between");
}

TEST(CaptureOrder, EagerMoeDispatchBetweenKeepsTheChain) {
  expect_calls_ordered_across(Between::kEagerMoeDispatch, "an eager MoE dispatch between");
}

TEST(CaptureOrder, CallOfAnotherCaptureBetweenKeepsTheChain) {
  expect_calls_ordered_across(Between::kCallOfAnotherCapture, "another capture's call between");
}

// Captures A (on a0, forked into a1, a2) and B (on b0, forked into b1, b2) open at once, their calls interleaved:
// A1 on a1, B1 on b1, A2 on a2, B2 on b2. Each graph keeps its own chain.
TEST(CaptureOrder, TwoCapturesAtOnceEachKeepTheirChain) {
  with_communicator([](Communicator& comm) {
    DeviceBuffer send(kCount * 4), a_first(kCount * 4), a_second(kCount * 4), b_first(kCount * 4), b_second(kCount * 4);
    StreamHandle a0, a1, a2, b0, b1, b2;
    Capture a(a0.get()), b(b0.get());
    a.fork(a1.get());
    a.fork(a2.get());
    b.fork(b1.get());
    b.fork(b2.get());
    const cudaGraphNode_t a_m1 = marker(a1.get());
    all_reduce(comm, send, a_first, a1.get());
    const cudaGraphNode_t b_m1 = marker(b1.get());
    all_reduce(comm, send, b_first, b1.get());
    all_reduce(comm, a_first, a_second, a2.get());
    const std::vector<cudaGraphNode_t> a_end = capture_frontier(a2.get());
    const cudaGraphNode_t a_m2 = marker(a2.get());
    all_reduce(comm, b_first, b_second, b2.get());
    const std::vector<cudaGraphNode_t> b_end = capture_frontier(b2.get());
    const cudaGraphNode_t b_m2 = marker(b2.get());
    expect_ordered_pair(b.end(), b_m1, b_m2, b_end, comm.rank(), "capture B of two at once");
    expect_ordered_pair(a.end(), a_m1, a_m2, a_end, comm.rank(), "capture A of two at once");
    comm.check();
  });
}

// One capture stays open while 200 others, one call each, begin and end on one stream: each of those ends the
// one before it (their stream shows it), so the open capture's chain is never pushed out.
TEST(CaptureOrder, ChainOutlivesManyCapturesOnOneStream) {
  with_communicator([](Communicator& comm) {
    DeviceBuffer send(kCount * 4), first(kCount * 4), second(kCount * 4), other(kCount * 4);
    StreamHandle s0, s1, s2, other_stream;
    Capture capture(s0.get());
    capture.fork(s1.get());
    capture.fork(s2.get());
    const cudaGraphNode_t m1 = marker(s1.get());
    all_reduce(comm, send, first, s1.get());
    for (int i = 0; i < kManyCaptures; ++i) {
      Capture short_capture(other_stream.get());
      all_reduce(comm, send, other, other_stream.get());
      short_capture.end();
    }
    all_reduce(comm, first, second, s2.get());
    const std::vector<cudaGraphNode_t> x2_end = capture_frontier(s2.get());
    const cudaGraphNode_t m2 = marker(s2.get());
    expect_ordered_pair(capture.end(), m1, m2, x2_end, comm.rank(),
                        std::to_string(kManyCaptures) + " captures on one stream between");
    comm.check();
  });
}

// 200 captures one after the other, each on streams of its own (made for it, destroyed after it), each with an
// eager all_reduce between its two calls: chains of ended captures whose streams are gone must give way.
TEST(CaptureOrder, ManyCapturesOnFreshStreamsEachKeepTheirChain) {
  with_communicator([](Communicator& comm) {
    EagerCallBetween eager_call(comm, Between::kEagerAllReduce);
    DeviceBuffer send(kCount * 4), first(kCount * 4), second(kCount * 4);
    StreamHandle uncaptured;
    bool ordered = true;
    for (int i = 0; i < kManyCaptures && ordered; ++i) {
      StreamHandle s0, s1, s2;
      Capture capture(s0.get());
      capture.fork(s1.get());
      capture.fork(s2.get());
      const cudaGraphNode_t m1 = marker(s1.get());
      all_reduce(comm, send, first, s1.get());
      eager_call.run(uncaptured.get());
      all_reduce(comm, first, second, s2.get());
      const std::vector<cudaGraphNode_t> x2_end = capture_frontier(s2.get());
      const cudaGraphNode_t m2 = marker(s2.get());
      ordered = expect_ordered_pair(capture.end(), m1, m2, x2_end, comm.rank(), "capture " + std::to_string(i));
    }
    cuda_check(cudaStreamSynchronize(uncaptured.get()), "cudaStreamSynchronize");
    comm.check();
  });
}

// x[j] of `rank` in replay `replay`: fresh every replay, never zero.
int32_t input_value(uint64_t seed, int replay, int rank, size_t j) {
  const uint64_t key = (static_cast<uint64_t>(replay) << 20) + static_cast<uint64_t>(rank) * 7919 + j;
  const uint64_t r = mix64(seed ^ mix64(key));
  const int32_t magnitude = static_cast<int32_t>(r % 1000) + 1;
  return (r >> 32) & 1 ? magnitude : -magnitude;
}

// The eager-between shape replayed: M1 spins 20 us on S1 before X1 = all_reduce(x -> a), an eager all_reduce is
// made during the capture, then X2 = all_reduce(a -> b) and M2 on S2; the graph is checked as above, then replayed.
// An X2 not ordered after X1 may read a before X1 wrote it (or, on several GPUs, share X1's signals and epochs: a
// hang or wrong data). Every replay takes fresh inputs, poisons a and b, and checks a = sum of the ranks' x and
// b = world * a. An LL size and one the staged or zero-copy kernels carry.
TEST(CaptureOrder, ReplaysWithAnEagerCallCapturedBetweenStayOrdered) {
  with_communicator([](Communicator& comm) {
    constexpr int kReplays = 200;
    const int rank = comm.rank(), world = comm.size();
    const uint64_t seed = shared_seed(comm);
    for (const size_t n : {size_t(3001), size_t(1) << 18}) {
      DeviceBuffer x(n * 4), a(n * 4), b(n * 4), eager_send(n * 4), eager_recv(n * 4);
      StreamHandle s0, s1, s2, uncaptured, replayed;
      cuda_check(cudaMemset(eager_send.get(), 1, n * 4), "cudaMemset");
      GraphHandles graph;
      {
        Capture capture(s0.get());
        capture.fork(s1.get());
        capture.fork(s2.get());
        const cudaGraphNode_t m1 = marker(s1.get(), 20000);
        comm.all_reduce(x.get(), a.get(), n, DataType::kInt32, ReduceOp::kSum, s1.get());
        eager_call_between(uncaptured.get(), [&] {
          comm.all_reduce(eager_send.get(), eager_recv.get(), n, DataType::kInt32, ReduceOp::kSum, uncaptured.get());
        });
        comm.all_reduce(a.get(), b.get(), n, DataType::kInt32, ReduceOp::kSum, s2.get());
        const std::vector<cudaGraphNode_t> x2_end = capture_frontier(s2.get());
        const cudaGraphNode_t m2 = marker(s2.get());
        const cudaGraph_t captured = capture.end();
        // CUDA may run the branches of a graph one after the other: the data alone need not show a missing edge.
        ASSERT_TRUE(expect_ordered_pair(captured, m1, m2, x2_end, rank, std::to_string(n) + " elements"));
        graph.exec = instantiate_on_every_rank(captured, s0.get());
      }
      std::vector<int32_t> host_x(n), got_a(n), got_b(n);
      int wrong_replays = 0;
      for (int replay = 0; replay < kReplays && wrong_replays < 3; ++replay) {
        for (size_t j = 0; j < n; ++j) host_x[j] = input_value(seed, replay, rank, j);
        cuda_check(cudaMemcpyAsync(x.get(), host_x.data(), n * 4, cudaMemcpyHostToDevice, replayed.get()), "upload x");
        cuda_check(cudaMemsetAsync(a.get(), kPoison, n * 4, replayed.get()), "poison a");
        cuda_check(cudaMemsetAsync(b.get(), kPoison, n * 4, replayed.get()), "poison b");
        cuda_check(cudaGraphLaunch(graph.exec, replayed.get()), "cudaGraphLaunch");
        cuda_check(cudaStreamSynchronize(replayed.get()), "cudaStreamSynchronize");  // NOTE [shared-GPU waits]
        cuda_check(cudaMemcpyAsync(got_a.data(), a.get(), n * 4, cudaMemcpyDeviceToHost, replayed.get()), "download a");
        cuda_check(cudaMemcpyAsync(got_b.data(), b.get(), n * 4, cudaMemcpyDeviceToHost, replayed.get()), "download b");
        cuda_check(cudaStreamSynchronize(replayed.get()), "cudaStreamSynchronize");
        comm.check();
        size_t wrong = 0, first_wrong = 0;
        int32_t expected_a_first = 0;
        for (size_t j = 0; j < n; ++j) {
          int32_t expected_a = 0;
          for (int r = 0; r < world; ++r) expected_a += input_value(seed, replay, r, j);
          if ((got_a[j] != expected_a || got_b[j] != expected_a * world) && wrong++ == 0) {
            first_wrong = j;
            expected_a_first = expected_a;
          }
        }
        if (wrong != 0) {
          ++wrong_replays;
          ADD_FAILURE() << "rank " << rank << ", " << n << " elements, replay " << replay << ": " << wrong
                        << " elements wrong; first at " << first_wrong << ": a = " << got_a[first_wrong] << ", b = "
                        << got_b[first_wrong] << ", expected " << expected_a_first << " and "
                        << expected_a_first * world;
        }
      }
    }
  });
}

}  // namespace
}  // namespace braid::testing

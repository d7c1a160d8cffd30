// braid — expert-parallel MoE token dispatch and combine on the GPUs of one host, graph-capturable: routing
// counts, their exchange, the layout and the data movement all happen on the device (no host round trip), and
// every buffer is sized by a shape class, not by the data.
//
//   braid::MoeBuffer moe = braid::MoeBuffer::create(comm, {.hidden = 7168, .max_tokens = 4096, .top_k = 8,
//                                                          .experts = 64, .expert_alignment = 128});
//   braid::MoeDispatchOutput got = moe.dispatch(x, topk_idx, topk_weights, T, nullptr, stream);
//   // grouped GEMM over got.x: expert j's rows are [got.expert_offsets[j], + got.expert_counts[j])
//   moe.combine(y, out, /*weighted=*/true, stream);
//
// fp8 dispatch: with shape.dispatch_type = kFloat8E4M3 (or kFloat8E5M2), dispatch moves fp8 rows with one float32
// scale per token and 128 columns (the layout DeepEP and DeepSeek's kernels use) at half the NVLink bytes of bf16:
//   got = moe.dispatch(x_fp8, x_scales, topk_idx, topk_weights, T, nullptr, stream);  // got.scales: per row
// combine still takes and returns shape.type rows (the experts' bf16 output).
//
// Experts are split evenly and in order: rank r holds experts [r * E / W, (r + 1) * E / W) (E a multiple of W).
// A token's expert ids must be distinct: a repeat (an id the token named at a smaller k) is skipped and reported
// by comm.check(), like an id outside [-1, E).
//
// Two layouts of the received rows (MoeShape::layout):
//   - expert-major (the default): a row per (token, expert) pair, each local expert's rows contiguous, for grouped
//     GEMMs; the routing counts are exchanged first, so a dispatch is two launches;
//   - rank-major: a row per (token, destination rank), with the token's local expert ids and weights beside it
//     (the caller permutes for its experts and reduces their outputs to one row per token before combine). A
//     token is written once per rank however many of its experts the rank holds, and dispatch needs no count
//     exchange: one launch, for decode batches (latency) and training batches (bytes) alike.
//       braid::MoeBuffer moe = braid::MoeBuffer::create(comm, {.hidden = 7168, .max_tokens = 128, .top_k = 8,
//                                                              .experts = 64, .layout = braid::MoeLayout::kRankMajor});
//       got = moe.dispatch(x, topk_idx, topk_weights, T, nullptr, stream);
//       // rows of source s: [s * max_tokens, + got.received_tokens[s]); experts' sums into got.combine_input
//       moe.combine(got.combine_input, out, /*weighted=*/false, stream);
//     With shape.low_latency (decode batches) a rank-major token keeps its index: row s * max_tokens + t holds
//     token t of rank s, or nothing when that token has no expert here (source_rank -1), so dispatch stores every
//     row at once, with no numbering pass before the first store.
//
// braid/braid.hpp includes this header; the Communicator a MoeBuffer is made on is declared there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "braid/error.hpp"
#include "braid/moe_shape.hpp"
#include "braid/types.hpp"

namespace braid {

namespace detail {
struct MoeState;
struct MoeTestAccess;
}
namespace collectives {
struct CollectiveContext;
}
class Communicator;
class MoeBuffer;

// Names one routed dispatch of a MoeBuffer (MoeDispatchOutput::handle) by its number: combine and redispatch check
// that the number is still the buffer's last routed dispatch's. A handle does not name its buffer: another
// buffer's handle with that number passes the check.
struct MoeHandle {
  uint64_t dispatch = 0;  // the buffer's routed dispatches up to and including this one; 0: none
};

// What dispatch returns: views of the MoeBuffer's memory on this rank, at the same addresses for every dispatch
// of the buffer (a captured graph may read them), holding the last dispatch's results until the next dispatch.
// Everything is device memory, written by the device: read counts and offsets on the device (or after
// synchronising). Fields marked with a layout are null (0) in the other one.
//
// Expert-major: the caller may overwrite x in place (an expert writing its output there) between dispatch and
// combine. Combine reads its own copy of the routing, not these arrays: changing weights does not change a
// weighted combine. Only rows below expert_offsets[local_experts] belong to the last dispatch; the rows past it,
// and every row on a rank whose dispatch overflowed, keep what an earlier dispatch left.
// Rank-major: row s * max_tokens + i holds the i-th token (in token order) rank s sent this rank, for
// i < received_tokens[s]; the contents of the other rows (and their metadata) are unspecified.
// Rank-major with shape.low_latency: row s * max_tokens + t holds token t of rank s for t < received_tokens[s]
// (rank s's T) when that token has an expert here. A row whose token has none is a hole: its source_rank and
// source_token are -1, its topk_expert all -1 and topk_weights 0, and its x (and scales) unspecified; combine never
// reads a hole's combine_input row. Rows at or past received_tokens[s] are unspecified.
struct MoeDispatchOutput {
  void* x = nullptr;                        // [capacity_rows, hidden] of the dispatch type. Expert-major: the rows
                                            // for this rank's experts, each expert's block contiguous and ordered by
                                            // source rank, then token index, then k (the same routing gives the
                                            // same layout every time); padding rows' contents are unspecified.
                                            // Rank-major: the received tokens, as said above
  const float* scales = nullptr;            // fp8 dispatch: [capacity_rows, hidden / kMoeScaleColumns], each row's
                                            // scales as its token's were (padding rows' unspecified); else null
  const int64_t* expert_counts = nullptr;   // [local_experts]: rows (expert-major) or received pairs (rank-major)
                                            // of each local expert
  const int64_t* expert_offsets = nullptr;  // expert-major: [local_experts + 1]: first row of each expert's block (a
                                            // multiple of expert_alignment); the last entry is the rows in use,
                                            // padding included
  const float* weights = nullptr;           // expert-major: [capacity_rows]: the routing weight of each row (0 for
                                            // padding)
  const int32_t* local_expert = nullptr;    // expert-major: [capacity_rows]: the row's expert, local index; -1 for
                                            // padding
  const int32_t* source_rank = nullptr;     // [capacity_rows]: the rank its token came from; -1 for padding and holes
  const int32_t* source_token = nullptr;    // [capacity_rows]: the token's index there; -1 for padding and holes
  // Rank-major:
  const int64_t* received_tokens = nullptr;  // [world]: tokens received from each source rank (with low_latency:
                                             // each source rank's T, holes included)
  const int32_t* topk_expert = nullptr;  // [capacity_rows, top_k]: the local index of the row's token's k-th expert
                                         // where this rank holds it, else -1 (another rank's, none, or refused)
  const float* topk_weights = nullptr;   // [capacity_rows, top_k]: that pair's weight where topk_expert is not -1,
                                         // else 0
  void* combine_input = nullptr;         // [capacity_rows, hidden] of shape.type in the buffer's symmetric memory:
                                         // write the experts' reduced rows here and pass it to combine as y to save
                                         // combine a copy (peers read it during combine)
  size_t capacity_rows = 0;
  int local_experts = 0;
  MoeHandle handle;  // this dispatch's routing, for combine and redispatch
};

// The receiving half of a rank-major dispatch or combine called with a hook: the call enqueued its sends (rows
// into the peers, then a signal; a low-latency dispatch in lines: its rows in lines) and returned; receive()
// enqueues the rest (wait for the peers, then the outputs: dispatch's expert_counts, combine's out; a rank-major
// dispatch's other metadata is written by the peers' sending halves, or, in lines, by this receiving half, which
// also copies the rows out of the line area). The caller's kernels enqueued between the two run while the
// rows travel, and may take every multiprocessor: the sending half has ended by then. Valid while its MoeBuffer
// lives; movable, not copyable.
class MoeHook {
 public:
  MoeHook() = default;
  MoeHook(MoeHook&& other) noexcept;
  MoeHook& operator=(MoeHook&& other) noexcept;
  MoeHook(const MoeHook&) = delete;
  MoeHook& operator=(const MoeHook&) = delete;

  // Whether a receiving half is still to be enqueued.
  bool pending() const { return state_ != nullptr; }
  // Enqueues the receiving half on `stream` (the sending half's stream or another: the communicator orders its
  // calls). Once per hook: kInvalidArgument for a hook with nothing pending. Where the communicator's ranks share
  // a GPU as threads of one process, the legacy default stream is refused (kInvalidArgument naming stream) and the
  // hook stays pending; a fatal failure recorded on the communicator (Communicator::check) raises again and leaves
  // it pending too. Until it is called, the MoeBuffer refuses every dispatch, redispatch, combine and
  // copy_expert_counts (kInvalidArgument naming the hook).
  // Destroying a pending hook, or moving another hook into it, drops its receiving half: the peers' signals
  // for it are never consumed, so that MoeBuffer refuses every later call; make a new one.
  void receive(Stream stream);

 private:
  friend class MoeBuffer;
  detail::MoeState* state_ = nullptr;
};

// Symmetric buffers for one shape class on one communicator, made once and reused by every dispatch/combine
// pair. Movable, not copyable. Two MoeBuffers never interfere, even used by two graphs at once on two streams.
// Limits: at most 16 ranks, experts <= kMoeMaxExperts, capacity_rows, max_tokens and the receive rows
// (capacity_rows, or the worst case when it is 0) < 2^31, and a buffer's byte sizes within size_t (a shape past
// them is refused, naming the field: shape.hidden for the byte sizes, shape.capacity_rows where it is set past the
// limit, shape.max_tokens where the worst case (capacity_rows 0) is, and shape.expert_alignment where the worst
// case at max_tokens 1, (E / W) * (expert_alignment - 1) + W * min(K, E / W), passes it already). A moved-from
// MoeBuffer's calls and getters throw kInvalidArgument.
class MoeBuffer {
 public:
  // Collective over comm's ranks. Throws kInvalidArgument naming the field of a bad shape, kMismatch when ranks
  // disagree on it, kUnsupported on a communicator of the NCCL backend. A rank whose shape is refused still joins
  // the ranks' exchange of shapes, so every rank fails at once: where this rank's shape passed but rank r's was
  // refused, this rank throws kMismatch naming rank r and quoting its refusal.
  static MoeBuffer create(Communicator& comm, const MoeShape& shape);
  // Receive rows that no routing can exceed. Expert-major: every token of every rank sent to one rank's experts,
  // W * max_tokens * min(K, E / W), plus the alignment padding of each local expert, (E / W) * (expert_alignment
  // - 1). Rank-major: W * max_tokens. Saturates at SIZE_MAX (for shapes that create refuses).
  static size_t worst_case_rows(const MoeShape& shape, int world);
  // Symmetric memory of one MoeBuffer's rows and metadata on each rank (see docs/moe.md for the breakdown), before
  // rounding to the allocation granularity; the buffer's own signal pad is allocated besides.
  // Validates the shape as create does (kInvalidArgument naming the field), and world: in [1, 16], else
  // kInvalidArgument naming it.
  static size_t symmetric_bytes(const MoeShape& shape, int world);

  MoeBuffer(MoeBuffer&&) noexcept;
  MoeBuffer& operator=(MoeBuffer&&) noexcept;
  ~MoeBuffer();

  // Getters: they never raise a failure the communicator recorded (comm.check() does).
  const MoeShape& shape() const;
  size_t capacity_rows() const;

  // Sends each token x[t] (hidden elements of shape().type) to the ranks holding its experts topk_idx[t, 0..K)
  // (index_type; -1: no expert), once per rank however many of its experts that rank holds, and lays the rows
  // out there in shape().layout. topk_weights [T, K] float32. T = num_tokens, or, when num_tokens_device is not null,
  // the int64 it points at (read on the device, <= max_tokens), so one captured graph serves every batch size;
  // num_tokens is not read when num_tokens_device is given. A host num_tokens above max_tokens (num_tokens_device
  // null) throws at the call. Expert ids outside [-1, E) and a token's repeated id (the pair is skipped), and a
  // device T above max_tokens or negative (T is taken as 0 on that rank: it sends nothing, and still receives its
  // peers' rows and writes its counts), are refused on the device: combine then sums the valid pairs only, and
  // comm.check() raises kInvalidArgument naming topk_idx or num_tokens_device.
  // Expert-major: a rank whose rows, alignment padding included, would exceed capacity_rows receives none:
  // its counts and offsets are still written (offsets[local_experts] > capacity_rows tells it), combine leaves
  // that rank's partials out, and comm.check() on that rank raises kInvalidArgument with the rows it needed and
  // capacity_rows. check() raises the first refusal recorded since the last check() only (Communicator::check):
  // a rank's overflow in a dispatch where that rank also refused an expert id is not raised. Every rank must call
  // it, even with T = 0.
  // `hook` (rank-major only, else kInvalidArgument naming it): when given, only the sending half is enqueued and
  // hook->receive() enqueues the rest; the outputs hold this dispatch once that half has run. T (and
  // num_tokens_device) is read by the sending half.
  MoeDispatchOutput dispatch(const void* x, const void* topk_idx, const float* topk_weights, size_t num_tokens,
                             const int64_t* num_tokens_device, Stream stream, MoeHook* hook = nullptr);
  // fp8 dispatch (shape().dispatch_type set): as above, x [T, hidden] fp8 rows and x_scales [T, hidden /
  // kMoeScaleColumns] float32, row-major; each received row comes with its token's scales (output.scales).
  // x_scales is required (kInvalidArgument naming it) when the shape dispatches fp8 and the call may carry tokens
  // (host T > 0 or num_tokens_device given), so the overload above refuses such a call; x_scales given for a
  // shape without dispatch_type is refused too. A null x_scales makes this overload the one above.
  MoeDispatchOutput dispatch(const void* x, const float* x_scales, const void* topk_idx, const float* topk_weights,
                             size_t num_tokens, const int64_t* num_tokens_device, Stream stream, MoeHook* hook = nullptr);

  // For the tokens of the last dispatch, accumulated in float32 into out [T, hidden] (shape().type) on the
  // dispatching rank: rank-major rounds once into out; expert-major rounds each rank's partial sum to
  // shape().type, then the sum of the partials once more; a token with no expert gets zeros. Every rank must call it; it may be called again
  // for the same dispatch (with other y).
  // Expert-major: out[t] = sum over k of w[t, k] * y[row of (t, k)] (weighted), or the plain sum (the caller
  // applied the weights). y is [capacity_rows, hidden] in the layout dispatch returned (the experts' outputs,
  // shape().type, also after an fp8 dispatch; y may be the dispatched x only when the dispatch moved
  // shape().type).
  // Rank-major: out[t] = sum over the ranks r token t went to of y on r at the row of t there; y is
  // [capacity_rows, hidden] of shape().type, a row per received token (the caller's sum of its experts' outputs,
  // weights applied), and weighted must be false (kInvalidArgument naming it). When y is not the dispatch's
  // combine_input, combine first copies there the rows peers read (this rank's own rows are read from y), once
  // every peer has completed the buffer's last combine when this one follows a combine. Peers read combine_input
  // until their combine has completed, which the buffer's next dispatch or redispatch waits for: write
  // combine_input only between a dispatch (or redispatch) and the first combine after it. So a combine whose y is
  // combine_input, made right after a combine that copied another y there (no dispatch or redispatch between, in
  // the order this rank made its calls), is refused with kInvalidArgument naming y: that copy holds only the peers'
  // rows, and a write since may have raced with the peers' reads. A combine of combine_input right after a combine
  // of combine_input is accepted and reads the same rows again; braid cannot see a write between the two, which
  // the rule above forbids.
  // `hook` (rank-major only): as for dispatch; the sending half copies y when it must and tells the peers that
  // this rank's rows are ready, the receiving half reads theirs and writes out.
  void combine(const void* y, void* out, bool weighted, Stream stream, MoeHook* hook = nullptr);
  // The same, for the dispatch `handle` names, which must be the buffer's last routed one (kInvalidArgument
  // naming handle otherwise): the backward pass of a redispatch, or a combine the caller ties to its dispatch.
  void combine(const MoeHandle& handle, const void* y, void* out, bool weighted, Stream stream, MoeHook* hook = nullptr);

  // Rank-major only (kInvalidArgument naming handle otherwise): dispatches new rows x (and fp8 scales) with the
  // routing of the dispatch `handle` names, which must be the buffer's last routed one: its T, destinations and
  // rows. Only the data moves; the metadata, received_tokens and expert_counts stay those of that dispatch. The
  // backward pass of a combine (the gradient of each token goes where its rows went) and a second tensor on one
  // routing. Otherwise as dispatch (ordering, hook, x_scales exactly when the shape dispatches fp8); a dispatch
  // may follow it with new routing.
  MoeDispatchOutput redispatch(const MoeHandle& handle, const void* x, const float* x_scales, Stream stream,
                               MoeHook* hook = nullptr);

  // One cudaMemcpyAsync of the last dispatch's expert_counts ([local_experts] int64) into host_counts, on
  // `stream`: after a dispatch on that stream (or its receiving half), read host_counts once the stream has
  // synchronised. Capturable in a graph when host_counts is pinned (cudaMallocHost).
  void copy_expert_counts(int64_t* host_counts, Stream stream);

 private:
  friend struct detail::MoeTestAccess;  // the tests' hooks into the state (not installed)
  explicit MoeBuffer(std::unique_ptr<detail::MoeState> state);
  // create() on the CUDA backend's context of the communicator (src/moe; create() itself is the communicator's).
  static MoeBuffer create_on(std::shared_ptr<collectives::CollectiveContext> context, const MoeShape& shape);
  std::unique_ptr<detail::MoeState> state_;
};

}  // namespace braid

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
//
// braid/braid.hpp includes this header; the Communicator a MoeBuffer is made on is declared there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "braid/error.hpp"
#include "braid/types.hpp"

namespace braid {

namespace detail {
struct MoeState;
}
namespace collectives {
struct CollectiveContext;
}
class Communicator;

// What a MoeBuffer is made for. Every rank passes the same shape.
struct MoeShape {
  size_t hidden = 0;                       // H: elements of one token row
  DataType type = DataType::kBFloat16;     // of token rows: kBFloat16, kFloat16 or kFloat32; what combine takes
                                           // and returns, and what dispatch moves unless dispatch_type is set
  // What dispatch moves, when not `type`: kFloat8E4M3 or kFloat8E5M2 rows, each with hidden / kMoeScaleColumns
  // float32 scales (hidden a multiple of kMoeScaleColumns). Rows and scales are copied bit for bit: braid neither
  // quantises nor dequantises.
  std::optional<DataType> dispatch_type;
  DataType index_type = DataType::kInt64;  // of topk_idx: kInt32 or kInt64
  size_t max_tokens = 0;                   // most tokens one rank passes to one dispatch (T <= this)
  int top_k = 0;                           // K: experts per token, 1..kMaxTopK
  int experts = 0;                         // E: experts in all, a multiple of the world size
  int expert_alignment = 1;                // each local expert's block of rows starts at a multiple of this
  // Rows of the receive buffer. 0: the worst case (worst_case_rows), so no routing can overflow it. A smaller
  // capacity saves memory; a dispatch whose rows would not fit writes none to that rank and check() reports it.
  size_t capacity_rows = 0;
};

constexpr int kMaxTopK = 16;
constexpr size_t kMoeScaleColumns = 128;  // columns of a token row that share one scale in fp8 dispatch

// What dispatch returns: views of the MoeBuffer's memory on this rank, valid until its next dispatch. Everything
// is device memory, written by the device: read counts and offsets on the device (or after synchronising).
// The caller may overwrite x in place (an expert writing its output there) between dispatch and combine; the
// metadata arrays are read by combine and must be left as they are.
struct MoeDispatchOutput {
  void* x = nullptr;                        // [capacity_rows, hidden] of the dispatch type: the rows for this
                                            // rank's experts,
                                            // expert-major, each expert's block contiguous and ordered by
                                            // source rank, then token index, then k (the same routing gives the
                                            // same layout every time); padding rows' contents are unspecified
  const float* scales = nullptr;            // fp8 dispatch: [capacity_rows, hidden / kMoeScaleColumns], each row's
                                            // scales as its token's were (padding rows' unspecified); else null
  const int64_t* expert_counts = nullptr;   // [local_experts]: rows of each local expert
  const int64_t* expert_offsets = nullptr;  // [local_experts + 1]: first row of each expert's block (a multiple of
                                            // expert_alignment); the last entry is the rows in use, padding included
  const float* weights = nullptr;           // [capacity_rows]: the routing weight of each row (0 for padding)
  const int32_t* local_expert = nullptr;    // [capacity_rows]: the row's expert, local index; -1 for padding
  const int32_t* source_rank = nullptr;     // [capacity_rows]: the rank its token came from; -1 for padding
  const int32_t* source_token = nullptr;    // [capacity_rows]: the token's index there; -1 for padding
  size_t capacity_rows = 0;
  int local_experts = 0;
};

// Symmetric buffers for one shape class on one communicator, made once and reused by every dispatch/combine
// pair. Movable, not copyable. Two MoeBuffers never interfere, even used by two graphs at once on two streams.
// Limits: at most 16 ranks, experts <= 1024 (moe::kMaxExperts), capacity_rows and max_tokens < 2^31.
class MoeBuffer {
 public:
  // Collective over comm's ranks. Throws kInvalidArgument naming the field of a bad shape, kMismatch when ranks
  // disagree on it.
  static MoeBuffer create(Communicator& comm, const MoeShape& shape);
  // Receive rows that no routing can exceed: every token of every rank sent to one rank's experts,
  // W * max_tokens * min(K, E / W), plus the alignment padding of each local expert.
  static size_t worst_case_rows(const MoeShape& shape, int world);
  // Symmetric memory one MoeBuffer of this shape holds on each rank (see docs/moe.md for the breakdown).
  // Validates the shape as create does (kInvalidArgument naming the field).
  static size_t symmetric_bytes(const MoeShape& shape, int world);

  MoeBuffer(MoeBuffer&&) noexcept;
  MoeBuffer& operator=(MoeBuffer&&) noexcept;
  ~MoeBuffer();

  const MoeShape& shape() const;
  size_t capacity_rows() const;

  // Sends each token x[t] (hidden elements of shape().type) to the ranks holding its experts topk_idx[t, 0..K)
  // (index_type; -1: no expert), once per rank however many of its experts that rank holds, and lays the rows
  // out there expert-major. topk_weights [T, K] float32. T = num_tokens, or, when num_tokens_device is not null,
  // the int64 it points at (read on the device, <= max_tokens), so one captured graph serves every batch size.
  // A host num_tokens above max_tokens throws at the call. Expert ids outside [-1, E) and a device T above
  // max_tokens are refused on the device (the pair, or the rank's whole call, is skipped; combine then sums the
  // valid pairs only) and reported by comm.check(). A rank whose rows would exceed capacity_rows receives none:
  // its counts and offsets are still written (offsets[local_experts] > capacity_rows tells it), combine leaves
  // that rank's partials out, and comm.check() on that rank reports it. Every rank must call it, even with T = 0.
  MoeDispatchOutput dispatch(const void* x, const void* topk_idx, const float* topk_weights, size_t num_tokens,
                             const int64_t* num_tokens_device, Stream stream);
  // fp8 dispatch (shape().dispatch_type set): as above, x [T, hidden] fp8 rows and x_scales [T, hidden /
  // kMoeScaleColumns] float32, row-major; each received row comes with its token's scales (output.scales). The
  // overload above refuses an fp8 shape, and this one a shape without dispatch_type (kInvalidArgument naming
  // x_scales).
  MoeDispatchOutput dispatch(const void* x, const float* x_scales, const void* topk_idx, const float* topk_weights,
                             size_t num_tokens, const int64_t* num_tokens_device, Stream stream);

  // For the tokens of the last dispatch: out[t] = sum over k of w[t, k] * y[row of (t, k)] with float32
  // accumulation (weighted), or the plain sum (the caller applied the weights). y is [capacity_rows, hidden] in
  // the layout dispatch returned (the experts' outputs, shape().type, also after an fp8 dispatch; y may be the
  // dispatched x only when the dispatch moved shape().type); out is [T, hidden] on the dispatching
  // rank; a token with no expert gets zeros. Every rank must call it; it may be called again for the same
  // dispatch (with other y).
  void combine(const void* y, void* out, bool weighted, Stream stream);

 private:
  explicit MoeBuffer(std::unique_ptr<detail::MoeState> state);
  // create() on the CUDA backend's context of the communicator (src/moe; create() itself is the communicator's).
  static MoeBuffer create_on(std::shared_ptr<collectives::CollectiveContext> context, const MoeShape& shape);
  std::unique_ptr<detail::MoeState> state_;
};

}  // namespace braid

// The arguments of the MoE kernels (plain data, by value) and the layout of a MoeBuffer's symmetric memory.
#pragma once

#include <cuda_runtime.h>  // __host__ __device__

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "braid/moe_shape.hpp"
#include "core/limits.hpp"

namespace braid::kernels::moe {

constexpr int kMaxWorld = braid::kMaxWorld;
constexpr int kMaxExperts = kMoeMaxExperts;  // every rank's expert layout is computed in shared memory
constexpr int kMoeThreads = 512;
constexpr int kMoeWarps = kMoeThreads / 32;
// Most blocks of a launch whose block b pairs with block b of every peer (all resident), a signal channel each:
// enough rows in flight to fill the links for a training batch.
constexpr int kScatterBlocks = 256;
// The channel of a signal every block of a launch waits for (rank-major combine).
constexpr int kGridChannel = kScatterBlocks;
constexpr int kMoeBlocksPerSm = 2;
// Small rank-major buffers take kDecodeSms multiprocessors unless the shape names some: fewer handshakes.
constexpr size_t kDecodeTokens = 512;
constexpr int kDecodeSms = 64;
// Low-latency buffers up to this many tokens a rank dispatch in LL128 lines (moe_lines.cu); above, copying rows out
// of the line area costs more than the signal saved.
constexpr size_t kLineTokens = 128;

// Multiprocessors a buffer of `shape` occupies (MoeShape::max_sms).
inline int moe_sms(const MoeShape& shape, int multiprocessors) {
  if (shape.max_sms > 0) return std::min(multiprocessors, shape.max_sms);
  if (shape.layout == MoeLayout::kRankMajor && shape.max_tokens <= kDecodeTokens) return std::min(multiprocessors, kDecodeSms);
  return multiprocessors;
}
constexpr int kCombineGroup = 128;  // threads summing one token's rows in combine (a warp alone loops too long)
constexpr int kCombineSlices = 8;   // most pieces of a token in combine
// Bytes of a row slice, a warp each: a few tokens keep every warp busy, a row's loads in flight together.
constexpr size_t kSliceBytes = 2048;

// A token's record, int32: its index on the source, n, its rows here ([2, 2 + K)), their weights, their experts.
__host__ __device__ constexpr size_t record_words(int top_k) { return 2 + 3 * static_cast<size_t>(top_k); }

// Byte offsets of the symmetric pieces, the same on every rank; a layout's unused pieces are empty.
struct SymmetricLayout {
  size_t rows;           // [capacity][hidden] of the dispatch type
  size_t row_scales;     // float[capacity][hidden / kMoeScaleColumns], fp8 dispatch only
  size_t row_weight;     // float[capacity] (expert-major)
  size_t row_expert;     // int32[capacity]: local expert, -1 padding (expert-major)
  size_t row_rank;       // int32[capacity]: -1 padding
  size_t row_token;      // int32[capacity]: -1 padding
  size_t records;        // int32[world][max_tokens][record_words] (expert-major)
  size_t counts;         // uint64[2][world][experts + world] (expert-major)
  size_t combine;        // [world][max_tokens][hidden]: expert-major partials; rank-major combine_input
  size_t topk_expert;    // rank-major: int32[capacity][top_k], local experts (-1: none here)
  size_t topk_weight;    // rank-major: float[capacity][top_k]
  size_t received;       // rank-major: int64[2][world], tokens from each source, then its T
  size_t block_rows;     // rank-major: [world][blocks] (first << 32 | count), rows block b of a source wrote
  size_t expert_pairs;   // rank-major: uint32[local experts] (NOTE [expert_pairs scope])
  size_t line_tokens;    // lines: [2][world] LL128 lines, each source's T
  size_t lines;          // lines: [2][world][max_tokens][slot_lines] LL128 lines, token slots
  size_t bytes;
};

// Phases of a rank-major call split by a MoeHook: the sending half ends after its signals.
constexpr int kWholeCall = 0, kSendingHalf = 1, kReceivingHalf = 2;

struct MoeLaunch {
  int world, rank, experts, local_experts, top_k, alignment;
  size_t hidden, max_tokens, capacity;
  size_t row_bytes;    // of a dispatched row
  size_t scale_bytes;  // of its scales (fp8), else 0
  const char* x;
  const char* x_scales;  // [T][scale_bytes]
  const void* topk_idx;
  const float* topk_weights;
  size_t num_tokens;                 // when num_tokens_device is null
  const int64_t* num_tokens_device;
  const char* y;                     // combine
  char* out;                         // combine
  bool weighted;
  char* peers[kMaxWorld];  // symmetric bases, by value
  SymmetricLayout layout;
  int32_t* pair_slot;        // [max_tokens][top_k]: index among this rank's pairs of the expert
  int32_t* slot_token;       // [world][max_tokens]: the token sent that rank as its i-th
  int32_t* token_row;        // [world][max_tokens]: token t's row on that rank
  uint32_t* token_ranks;     // [max_tokens]: ranks each token went to (bits)
  uint32_t* delivered_ranks; // ranks whose rows fitted in the last dispatch
  int32_t* combine_plan;     // [4]: send's blocks and pieces; flags: no combine since the dispatch, a dispatch before
  int64_t* tokens;           // T of the last dispatch
  int64_t* received_tokens;  // [world]
  int64_t* expert_counts;
  int64_t* expert_offsets;
  uint64_t* epoch;           // dispatches so far (parity of the count matrix)
  uint64_t* line_epochs;     // [kScatterBlocks]: NOTE [line sequence]
  uint64_t* counts_cleared;  // sequence whose counts block 0 cleared (lines)
  unsigned int* blocks_done;  // scatter: blocks that read epoch; rank-major: blocks done
  unsigned int* copies_done;  // rank-major combine: blocks that copied y
  unsigned long long* combine_claims;
  int blocks;                 // of the paired launches, agreed at create
  bool rank_major;
  bool fixed_rows;            // MoeShape::low_latency
  size_t slot_lines;          // of a token's slot in lines (moe_lines.cu); 0: not in lines
  bool copy_y;                // rank-major combine: y is not combine_input
  int phase;                  // kWholeCall, or a half of a call split by a MoeHook
  bool reuse_routing;         // redispatch: the last dispatch's T, ranks and rows
  device::SignalPad pad;     // the buffer's own channels; errors go to the communicator's words
  unsigned int dispatch_id, combine_id;  // for error reports
};

template <typename T>
__host__ __device__ inline T* at_offset(char* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

}  // namespace braid::kernels::moe

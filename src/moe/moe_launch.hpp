// The arguments of the MoE kernels (plain data, passed by value) and the layout of a MoeBuffer's memory.
//
// Symmetric (every peer writes into it): the receive rows and their metadata, the token records (per source rank
// and received token: the token's index there and its rows here, with their weights and experts), the count
// matrix (every rank's routing counts, two parities) and the combine area (per expert rank: its partial sums of
// every token of this rank). Local: what this rank's routing computed, and the outputs dispatch hands back.
#pragma once

#include <cuda_runtime.h>  // __host__ __device__

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "braid/moe.hpp"
#include "core/limits.hpp"

namespace braid::moe {

constexpr int kMaxWorld = braid::kMaxWorld;  // ranks of any communicator (core/limits.hpp)
constexpr int kMaxExperts = kMoeMaxExperts;  // the layout of every rank's experts is computed in shared memory
constexpr int kMoeThreads = 512;
constexpr int kMoeWarps = kMoeThreads / 32;
// Dispatch's scatter and combine's send launch up to this many blocks on every rank (two per multiprocessor at
// most: their blocks wait for the same block of every peer, so all must be resident at once), each a signal
// channel of the MoeBuffer's own pad: enough to keep a row per warp in flight for thousands of tokens (with far
// fewer blocks a training batch is bound by latency, too few rows in flight to fill the links).
constexpr int kScatterBlocks = 256;
// The channel after the blocks' own: one signal that every block of a launch waits for (a rank-major combine
// whose rows earlier kernels wrote).
constexpr int kGridChannel = kScatterBlocks;
constexpr int kMoeBlocksPerSm = 2;
// A rank-major buffer for batches of at most kDecodeTokens tokens a rank takes kDecodeSms multiprocessors unless
// its shape names a budget: its dispatch and combine are faster on fewer blocks (fewer handshakes, and a block
// per token or two), while training-sized batches need every block to keep the links busy.
constexpr size_t kDecodeTokens = 512;
constexpr int kDecodeSms = 64;
// A low-latency buffer of at most this many tokens a rank dispatches in LL128 lines (moe_lines.cu) where the GPUs
// carry them: faster from 1 to 128 tokens, alone and in a layer; from 256 on, copying the rows out of the line
// area costs more than the signal it saves.
constexpr size_t kLineTokens = 128;

// Multiprocessors a buffer of `shape` occupies on a GPU with `multiprocessors` of them (MoeShape::max_sms).
inline int moe_sms(const MoeShape& shape, int multiprocessors) {
  if (shape.max_sms > 0) return std::min(multiprocessors, shape.max_sms);
  if (shape.layout == MoeLayout::kRankMajor && shape.max_tokens <= kDecodeTokens) return std::min(multiprocessors, kDecodeSms);
  return multiprocessors;
}
constexpr int kCombineGroup = 128;  // threads summing one token's rows in combine (a warp alone loops too long)
constexpr int kCombineSlices = 8;   // at most, pieces of a token that combine's groups sum apart
// A row is moved in slices of about this many bytes, one warp a slice, so a few tokens keep every warp busy
// (decode batches) and a row's loads are in flight together.
constexpr size_t kSliceBytes = 2048;

// A token's record on a rank it was sent to, in 32-bit words: [0] its index on the source, [1] n, its rows
// here, [2, 2 + K) those rows in the order of k, then their weights (float bits), then their local experts.
__host__ __device__ constexpr size_t record_words(int top_k) { return 2 + 3 * static_cast<size_t>(top_k); }

// One rank's view of the symmetric area, as byte offsets (the same on every rank) from its base. Pieces one
// layout does not use are empty.
struct SymmetricLayout {
  size_t rows;           // [capacity][hidden] elements of the dispatch type
  size_t row_scales;     // float[capacity][hidden / kMoeScaleColumns] with fp8 dispatch (else an empty piece)
  size_t row_weight;     // float[capacity] (expert-major)
  size_t row_expert;     // int32[capacity]: local expert, -1 padding (expert-major)
  size_t row_rank;       // int32[capacity]: source rank, -1 padding
  size_t row_token;      // int32[capacity]: source token, -1 padding
  size_t records;        // int32[world][max_tokens][record_words]: per (source, received token) its record
                         // (expert-major)
  size_t counts;         // uint64[2][world][experts + world]: each source's expert counts and token-per-rank
                         // counts, tagged with its dispatch number (moe_layout.cuh; expert-major)
  size_t combine;        // [world][max_tokens][hidden] elements of the row type. Expert-major: each expert rank's
                         // partial sum of each token of this rank. Rank-major: this rank's combine input, a row per
                         // received token (combine_input), which the token's source reads
  size_t topk_expert;    // rank-major: int32[capacity][top_k], the row's local experts (-1: none here)
  size_t topk_weight;    // rank-major: float[capacity][top_k]
  size_t received;       // rank-major: int64[world] tokens each source sent here in the last dispatch, then
                         // int64[world] each source's T
  size_t block_rows;     // rank-major: int64[world][blocks]: the rows (first << 32 | count) block b of each source
                         // wrote here in the last dispatch, which that source's block b reads back in combine
  size_t expert_pairs;   // rank-major: uint32[local experts]: pairs each source added for this dispatch (the last
                         // block moves them to expert_counts and clears them)
  size_t line_tokens;    // fixed rows in lines (moe_lines.cu): [2][world] LL128 lines, each source's T
  size_t lines;          // fixed rows in lines: [2][world][max_tokens][slot_lines] LL128 lines, each source's token
                         // slots (metadata, row, scales)
  size_t bytes;          // all of it
};

// The halves of a rank-major call split by a MoeHook: the sending half ends after its signals, the receiving half
// starts at the waits.
constexpr int kWholeCall = 0, kSendingHalf = 1, kReceivingHalf = 2;

struct MoeLaunch {
  // Shape.
  int world, rank, experts, local_experts, top_k, alignment;
  size_t hidden, max_tokens, capacity;
  size_t row_bytes;    // of a dispatched row
  size_t scale_bytes;  // of a dispatched row's scales (fp8 dispatch), else 0
  // Inputs of this call.
  const char* x;
  const char* x_scales;  // [T][scale_bytes] with fp8 dispatch
  const void* topk_idx;
  const float* topk_weights;
  size_t num_tokens;                 // used when num_tokens_device is null
  const int64_t* num_tokens_device;  // else read here
  const char* y;                     // combine
  char* out;                         // combine
  bool weighted;
  // Symmetric memory: every rank's base ([world] of them, by value: collectives/peer_bases.hpp), and where things
  // are in it.
  char* peers[kMaxWorld];
  SymmetricLayout layout;
  // Local memory.
  int32_t* pair_slot;        // [max_tokens][top_k]: index of the pair among this rank's pairs of its expert
  int32_t* slot_token;       // [world][max_tokens]: the token this rank sends to that rank as its i-th
  int32_t* token_row;        // rank-major: [world][max_tokens]: the row of token t in that rank's region for this rank
                             // (unused with fixed rows)
  uint32_t* token_ranks;     // [max_tokens]: ranks each token went to (bit mask), for combine
  uint32_t* delivered_ranks; // [1]: ranks whose rows fitted their capacity in the last dispatch
  int32_t* combine_plan;     // [4]: blocks of combine's send with work after the last dispatch (the same on every
                             // rank), the pieces it cuts each token into, 1 while no combine followed the last
                             // dispatch, and (for scatter) whether the call before this dispatch was one
  int64_t* tokens;           // [1]: T of the last dispatch (after checks)
  int64_t* received_tokens;  // [world]: tokens received from each source in the last dispatch
  int64_t* expert_counts;    // [local_experts] output
  int64_t* expert_offsets;   // [local_experts + 1] output
  uint64_t* epoch;           // dispatches so far (parity of the count matrix)
  uint64_t* line_epochs;     // [kScatterBlocks]: dispatches in lines so far, per block (moe_lines.cu: block b's alone)
  uint64_t* counts_cleared;  // [1]: the sequence of the last dispatch in lines whose expert counts block 0 cleared
  unsigned int* blocks_done;  // blocks of a scatter that read epoch (the last advances it); rank-major: blocks done
  unsigned int* copies_done;  // rank-major combine: blocks that copied y into combine_input (the last one signals)
  unsigned long long* combine_claims;  // [1]: pieces of tokens combine's send groups have claimed (reduce resets it)
  int blocks;                 // of scatter and combine's send: the same on every rank (agreed at create)
  bool rank_major;            // MoeLayout::kRankMajor
  bool fixed_rows;            // rank-major with MoeShape::low_latency: token t of source s is row s * max_tokens + t
  size_t slot_lines;          // fixed rows whose dispatch moves LL128 lines (moe_lines.cu): lines of a token's slot (a
                              // multiple of 4); 0: the dispatch of moe_rank_major.cu
  bool copy_y;                // rank-major combine: y is not combine_input, so combine copies it there first
  int phase;                  // rank-major: kWholeCall, or one half of a call split by a MoeHook
  bool reuse_routing;         // rank-major dispatch: the last dispatch's routing (T, ranks, rows); only data moves
  device::SignalPad pad;     // this MoeBuffer's own channels; errors go to the communicator's words
  unsigned int dispatch_id, combine_id;  // collective ids for error reports
};

template <typename T>
__host__ __device__ inline T* at_offset(char* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

}  // namespace braid::moe

// braid — the shape of a MoE buffer (MoeShape) and its limits: plain types that braid/moe.hpp, which declares
// MoeBuffer, and the dispatch and combine kernels share.
#pragma once

#include <cstddef>
#include <optional>

#include "braid/types.hpp"

namespace braid {

// How dispatch lays out the rows a rank receives (see MoeDispatchOutput in braid/moe.hpp).
enum class MoeLayout {
  kExpertMajor,  // a row per (token, local expert) pair, grouped by expert
  kRankMajor,    // a row per (token, destination rank), grouped by source rank, in token order
};

// What a MoeBuffer is made for. Every rank passes the same shape.
struct MoeShape {
  size_t hidden = 0;                       // H >= 1: elements of one token row
  DataType type = DataType::kBFloat16;     // of token rows: kBFloat16, kFloat16 or kFloat32; what combine takes
                                           // and returns, and what dispatch moves unless dispatch_type is set
  // What dispatch moves, when not `type`: kFloat8E4M3 or kFloat8E5M2 rows, each with hidden / kMoeScaleColumns
  // float32 scales (hidden a multiple of kMoeScaleColumns). Rows and scales are copied bit for bit: braid neither
  // quantises nor dequantises.
  std::optional<DataType> dispatch_type;
  DataType index_type = DataType::kInt64;  // of topk_idx: kInt32 or kInt64
  size_t max_tokens = 0;                   // most tokens one rank passes to one dispatch (T <= this), 1..2^31 - 1
  int top_k = 0;                           // K: experts per token, 1..kMaxTopK
  int experts = 0;                         // E >= 1: experts in all, a multiple of the world size, at most
                                           // kMoeMaxExperts
  int expert_alignment = 1;                // each local expert's block of rows starts at a multiple of this
                                           // (expert-major; must be 1 with kRankMajor)
  // Rows of the receive buffer (expert-major). 0: the worst case (worst_case_rows), so no routing can overflow
  // it. A smaller capacity saves memory; a dispatch whose rows would not fit writes none to that rank and check()
  // reports it. Must be 0 with kRankMajor, whose rows are always world * max_tokens (no routing overflows them).
  size_t capacity_rows = 0;
  MoeLayout layout = MoeLayout::kExpertMajor;
  // Multiprocessors' worth of the GPU that the kernels moving rows may take (every rank-major kernel, and
  // expert-major's scatter, send and reduce): they run 2 * max_sms blocks (their launch bounds fit 2 on a
  // multiprocessor; at most 256, and as many on every rank: the fewest any rank's GPU takes), every block resident
  // at once, which leaves room for kernels that overlap them. The GPU's
  // block scheduler places the blocks: on an otherwise idle GPU they may spread over up to 2 * max_sms
  // multiprocessors, a block each. Expert-major's routing kernel, one short block per expert plus world + 1, does
  // not follow it. 0: every multiprocessor (at most 128 are used), except in a rank-major buffer with
  // max_tokens <= 512, which takes 64: its batches are faster on fewer blocks. Where ranks share a GPU
  // (BRAID_ALLOW_SHARED_GPU=1) those kernels take at most 64 / (the most ranks on one GPU) blocks, as every
  // collective does.
  int max_sms = 0;
  // Rank-major only (kInvalidArgument naming it otherwise): fixed rows, for decode batches. Token t of rank s is row s
  // * max_tokens + t on every rank it goes to, so a dispatch numbers nothing before its first store; the rows of s's
  // tokens that have no expert on a rank are holes there (see MoeDispatchOutput in braid/moe.hpp). Combine's result is
  // the same as without it. With max_tokens <= 128 (and a token's slot of lines, its row and scales with a metadata
  // line, under 4 GiB) the buffer also holds a line area (docs/moe.md, "What a shape costs"), and where every pair of
  // GPUs carries LL128 lines (NVLink, BRAID_LL128 on) dispatch sends each row there with its metadata in 128-byte lines
  // that carry their own flags, and the receiver copies them out: no signal and no barrier. Otherwise it stores the
  // rows into the peers' rows and signals, as without it.
  bool low_latency = false;
};

constexpr int kMaxTopK = 16;
constexpr int kMoeMaxExperts = 1024;
constexpr size_t kMoeScaleColumns = 128;  // columns of a token row that share one scale in fp8 dispatch

}  // namespace braid

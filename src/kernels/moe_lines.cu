// MoE dispatch with fixed rows in LL128 lines (kernels/ll128.cuh), one launch, for low-latency buffers of at most
// kLineTokens tokens a rank where the GPUs carry lines whole (ll128_lines). No barrier, no signal: each line
// carries the call's sequence as its flag. Per token, a source sends each peer a slot of lines (line_slot): line 0
// its metadata there (index -1: a hole, and line 0 alone goes), then row and scales, each from a line of its own;
// block 0 also sends each peer a line with T. Block b sends its tokens, then receives the same of every peer.
//
// NOTE [line sequence]
// Block b's sequence is its dispatches in lines plus one (line_epochs[b], block b's alone, so no grid-wide step
// ends the launch); every block of every rank runs every dispatch, so they agree. A line of an earlier dispatch,
// or never written (zeroed), never carries this one's. Two parities suffice: a rank writes parity p again only
// in the dispatch after next, after its next dispatch received every peer's lines, which a peer sends only once
// its kernels before (this dispatch's receiving included) are complete. Likewise a peer's lines arrive only once
// its last combine is complete. So a dispatch after a dispatch passes no entry barrier.
#include "braid/moe_shape.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/ll128.cuh"
#include "core/kernel_modules.hpp"
#include "kernels/moe_kernels.hpp"
#include "kernels/moe_layout.cuh"
#include "kernels/moe_warp.cuh"
#include "sync/device_sync.hpp"

namespace braid::kernels::moe {
namespace {

using kernels::kLL128LineBytes;
using kernels::kLL128LinePayload;
using kernels::kLL128WarpWire;

// Groups of 4 lines a warp loads and stores, or polls, at once; more would spill at 64 registers a thread.
constexpr int kGroupBatch = 4;
constexpr int kPollBatch = 2;

// Block b's tokens (as piece_of<1>) in 32-bit arithmetic: the kernel is bound by the instructions on its path.
__device__ __forceinline__ Span block_tokens(size_t tokens) {
  const uint32_t total = static_cast<uint32_t>(tokens), length = (total + gridDim.x - 1) / gridDim.x;
  const uint32_t begin = min(total, blockIdx.x * length);
  return {begin, min(total, begin + length)};
}

__device__ __forceinline__ char* line_slot(const MoeLaunch& launch, int owner, uint32_t parity, int source, uint32_t t) {
  const uint32_t slot = (parity * launch.world + source) * static_cast<uint32_t>(launch.max_tokens) + t;
  return launch.peers[owner] + launch.layout.lines + uint64_t(slot) * static_cast<uint32_t>(launch.slot_lines * kLL128LineBytes);
}

__device__ __forceinline__ char* tokens_line(const MoeLaunch& launch, int owner, uint32_t parity, int source) {
  return launch.peers[owner] + launch.layout.line_tokens + (parity * launch.world + source) * kLL128LineBytes;
}

// A lane's part of line `line` of a slot: row or scale bytes from `offset` (`left` of them), or nothing.
struct LinePart {
  bool row, scales;
  uint32_t offset, left;
};

// The lane's part: bytes [in_line, in_line + part_bytes) of its line.
__device__ __forceinline__ uint32_t lane_in_line() { return (lane_id() & 7u) * 16u; }
__device__ __forceinline__ uint32_t part_bytes() { return (lane_id() & 7u) == 7u ? 8u : 16u; }

template <bool kScales>
__device__ __forceinline__ LinePart line_part(const MoeLaunch& launch, uint32_t line) {
  const uint32_t payload = static_cast<uint32_t>(kLL128LinePayload);
  const uint32_t row_bytes = static_cast<uint32_t>(launch.row_bytes), scale_bytes = static_cast<uint32_t>(launch.scale_bytes);
  const uint32_t row_lines = (row_bytes + payload - 1) / payload;
  LinePart where{false, false, 0, 0};
  if (line >= 1 && line <= row_lines) {
    where.offset = (line - 1) * payload + lane_in_line();
    where.row = where.offset < row_bytes;
    where.left = where.row ? row_bytes - where.offset : 0;
  } else if (kScales && line > row_lines) {
    where.offset = (line - 1 - row_lines) * payload + lane_in_line();
    where.scales = where.offset < scale_bytes;
    where.left = where.scales ? scale_bytes - where.offset : 0;
  }
  return where;
}

// Whole 8-byte aligned parts inline, the rest out of line and by value: an array whose address a call takes lives
// in local memory, where each group's loads would wait to be stored before the next group's issue.
struct PartWords {
  uint64_t low, high;
};
__device__ __noinline__ PartWords load_part_slowly(const char* source, uint32_t left, uint32_t size) {
  uint64_t words[2];
  kernels::load_part(source, left, size, words);
  return {words[0], words[1]};
}
__device__ __noinline__ void store_part_slowly(char* destination, uint32_t left, uint32_t size, uint64_t low, uint64_t high) {
  const uint64_t words[2] = {low, high};
  kernels::store_part(destination, left, size, words);
}
__device__ __forceinline__ void load_row_part(const char* source, uint32_t left, uint64_t (&words)[2]) {
  const uint32_t size = part_bytes();
  if (left >= size && (reinterpret_cast<uintptr_t>(source) & 7) == 0) {
    words[0] = reinterpret_cast<const uint64_t*>(source)[0];
    words[1] = size == 16 ? reinterpret_cast<const uint64_t*>(source)[1] : 0;
  } else {
    const PartWords part = load_part_slowly(source, left, size);
    words[0] = part.low, words[1] = part.high;
  }
}
__device__ __forceinline__ void store_row_part(char* destination, uint32_t left, const uint64_t (&words)[2]) {
  const uint32_t size = part_bytes();
  if (left >= size && (reinterpret_cast<uintptr_t>(destination) & 7) == 0) {
    reinterpret_cast<uint64_t*>(destination)[0] = words[0];
    if (size == 16) reinterpret_cast<uint64_t*>(destination)[1] = words[1];
  } else {
    store_part_slowly(destination, left, size, words[0], words[1]);
  }
}

// Line 0 of a slot on rank r, lanes 0-7: parts 0-1 the local experts (16 int16, -1: none), 2-5 their weights,
// 6 the token's index (-1: a hole), 7 the flag. Lane k < K holds expert k and its weight.
__device__ __forceinline__ void metadata_line(int expert, float weight, int r, int local_experts, int32_t token,
                                              uint64_t (&words)[2]) {
  const unsigned int lane = lane_id();
  const bool here = expert >= r * local_experts && expert < (r + 1) * local_experts;
  const int local = here ? expert - r * local_experts : -1;
  const float w = here ? weight : 0.0f;
  uint64_t experts[2] = {0, 0}, weights[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint64_t e = static_cast<uint16_t>(static_cast<int16_t>(__shfl_sync(kFullWarp, local, (lane & 1) * 8 + i)));
    experts[i / 4] |= e << (16 * (i % 4));
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint64_t v = __float_as_uint(__shfl_sync(kFullWarp, w, ((lane - 2) & 3) * 4 + i));
    weights[i / 2] |= v << (32 * (i % 2));
  }
  if (lane < 2) {
    words[0] = experts[0], words[1] = experts[1];
  } else if (lane < 6) {
    words[0] = weights[0], words[1] = weights[1];
  } else {
    words[0] = lane == 6 ? static_cast<uint32_t>(token) : 0, words[1] = 0;
  }
}

// Polls line 0 (lanes 0-7, into `metadata`) and `count` groups from `wire` together, one round trip not two,
// until line 0 carries `flag` and either is a hole (`token` -1; no other line comes) or every group carries it.
template <int kBatch>
__device__ __forceinline__ bool poll_slot(const char* line0, const char* wire, int count, uint64_t flag,
                                          kernels::WarpPollBound& bound, uint64_t (&metadata)[2],
                                          uint64_t (&words)[kBatch][2], int32_t& token) {
  const unsigned int lane = lane_id();
  const bool carries_flag = (lane & 7u) == 7u;
  bool ready[kBatch];
#pragma unroll
  for (int i = 0; i < kBatch; ++i) ready[i] = i >= count;
  bool have_line0 = false;
  for (;;) {
    if (!have_line0 && lane < 8) kernels::load_wire16(line0, &metadata[0], &metadata[1]);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (!ready[i]) kernels::load_wire16(wire + i * kLL128WarpWire, &words[i][0], &words[i][1]);
    }
    if (!have_line0) have_line0 = __all_sync(kFullWarp, lane != 7 || metadata[1] == flag) != 0;
    bool all = true;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (!ready[i]) ready[i] = __all_sync(kFullWarp, !carries_flag || words[i][1] == flag) != 0;
      all = all && ready[i];
    }
    if (have_line0) {
      token = static_cast<int32_t>(__shfl_sync(kFullWarp, metadata[0], 6));
      if (token < 0 || all) return true;
    }
    if (bound.give_up()) return false;
  }
}

// This rank's metadata for its own row of token t, as a peer writes it from line 0.
__device__ __forceinline__ void write_own_metadata(const MoeLaunch& launch, size_t t, int expert, float weight) {
  const int me = launch.rank, K = launch.top_k, L = launch.local_experts;
  const unsigned int lane = lane_id();
  const int64_t row = int64_t(me) * int64_t(launch.max_tokens) + int64_t(t);
  char* base = launch.peers[me];
  const bool here = expert >= me * L && expert < (me + 1) * L;
  if (static_cast<int>(lane) < K) {
    at_offset<int32_t>(base, launch.layout.topk_expert)[row * K + lane] = here ? expert - me * L : -1;
    at_offset<float>(base, launch.layout.topk_weight)[row * K + lane] = here ? weight : 0.0f;
  }
  const bool sent = __any_sync(kFullWarp, here) != 0;
  if (lane == 0) {
    at_offset<int32_t>(base, launch.layout.row_token)[row] = sent ? static_cast<int32_t>(t) : -1;
    at_offset<int32_t>(base, launch.layout.row_rank)[row] = sent ? me : -1;
  }
}

// Row `row`'s metadata from line 0's words (lanes 0-7), its pairs into `block_pairs`.
__device__ __forceinline__ void write_metadata(const MoeLaunch& launch, int64_t row, int source, int32_t token,
                                              const uint64_t (&words)[2], uint32_t* block_pairs) {
  const int K = launch.top_k;
  const unsigned int lane = lane_id();
  char* base = launch.peers[launch.rank];
  if (lane < 2) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int k = static_cast<int>(lane) * 8 + i;
      const int local = static_cast<int16_t>(static_cast<uint16_t>(words[i / 4] >> (16 * (i % 4))));
      if (k < K) {
        at_offset<int32_t>(base, launch.layout.topk_expert)[row * K + k] = local;
        if (local >= 0) atomicAdd(&block_pairs[local], 1u);
      }
    }
  } else if (lane < 6) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = static_cast<int>(lane - 2) * 4 + i;
      if (k < K) at_offset<float>(base, launch.layout.topk_weight)[row * K + k] = __uint_as_float(static_cast<uint32_t>(words[i / 2] >> (32 * (i % 2))));
    }
  } else if (lane == 6) {
    at_offset<int32_t>(base, launch.layout.row_token)[row] = token;
    at_offset<int32_t>(base, launch.layout.row_rank)[row] = token >= 0 ? source : -1;
  }
}

// Block 0, once it has sent: clears the counts and publishes `flag`, after which every block adds its pairs.
__device__ __forceinline__ void clear_counts(const MoeLaunch& launch, uint64_t flag) {
  for (int j = threadIdx.x; j < launch.local_experts; j += blockDim.x) launch.expert_counts[j] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    device::store_relaxed_system(launch.counts_cleared, flag);
  }
}

// Thread 0: true once block 0 cleared the counts (it is resident, so it runs); false when the wait gave up.
__device__ __forceinline__ bool counts_are_cleared(const MoeLaunch& launch, uint64_t flag) {
  if (blockIdx.x == 0 && launch.phase != kReceivingHalf) return true;
  return device::spin_until(launch.pad, [&] { return device::load_acquire_system(launch.counts_cleared) == flag; },
                            launch.dispatch_id, kSiteMoeCountsCleared, launch.rank, blockIdx.x);
}

// The block's pairs into the counts once `cleared`; false when that wait gave up.
__device__ __forceinline__ bool add_pairs_to_counts(const MoeLaunch& launch, const int& cleared, uint32_t* block_pairs) {
  __syncthreads();
  if (!cleared) return false;
  for (int j = threadIdx.x; j < launch.local_experts; j += blockDim.x) {
    if (block_pairs[j] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(launch.expert_counts + j), block_pairs[j]);
    block_pairs[j] = 0;
  }
  return true;
}

struct PeerTokens {
  uint32_t tokens[kMaxWorld];  // [p]: the T of peer me + p
  int state;                   // 0: not read yet, 1: read, 2: a wait gave up
};

// One warp: the peers' T lines, 4 at a time (lanes 8j to 8j + 7), into `peers`, `received` and block_rows.
__device__ __forceinline__ void read_peer_tokens(const MoeLaunch& launch, uint64_t flag, PeerTokens* peers) {
  const int me = launch.rank, W = launch.world;
  const unsigned int lane = lane_id();
  bool ok = true;
#pragma unroll 1
  for (int first = 1; first < W && ok; first += 4) {
    const int p = first + static_cast<int>(lane / 8), s = (me + p) % W;
    const bool mine = p < W;
    kernels::WarpPollBound bound(launch.pad, launch.dispatch_id, kSiteMoeRows, (me + first) % W);
    uint64_t words[1][2] = {{0, 0}};
    ok = kernels::poll_groups(tokens_line(launch, me, flag & 1, s) + (lane & 7u) * 16, kLL128WarpWire, 1, mine, flag, bound, words);
    if (ok && mine && (lane & 7u) == 0) {
      const size_t tokens = min(static_cast<size_t>(words[0][0]), launch.max_tokens);
      peers->tokens[p] = static_cast<uint32_t>(tokens);
      if (blockIdx.x == 0) {
        int64_t* received = at_offset<int64_t>(launch.peers[me], launch.layout.received);
        received[s] = received[W + s] = static_cast<int64_t>(tokens);
      }
      const Span range = block_tokens(tokens);
      at_offset<uint64_t>(launch.peers[me], launch.layout.block_rows)[size_t(s) * launch.blocks + blockIdx.x] =
          uint64_t(range.begin) << 32 | uint64_t(range.end - range.begin);
    }
  }
  if (lane == 0) peers->state = ok ? 1 : 2;
  __syncwarp();
}

// Lane k's expert, as lane_expert from the loaded `id`; `ranks`: the token's ranks (bits).
template <typename Index>
__device__ __forceinline__ int warp_expert(const MoeLaunch& launch, int64_t id, size_t t, const ExpertRanks& expert_ranks,
                                           bool report, uint32_t& ranks) {
  const int k = static_cast<int>(lane_id());
  const bool bad = id < -1 || id >= launch.experts;
  const int expert = bad ? -1 : static_cast<int>(id);
  bool repeated = false;
  for (int j = 0; j < launch.top_k; ++j) {
    const int other = __shfl_sync(kFullWarp, expert, j);
    repeated |= j < k && other == expert && expert >= 0;
  }
  ranks = __reduce_or_sync(kFullWarp, expert >= 0 ? 1u << expert_ranks.of(expert) : 0u);
  if (report) {
    const unsigned int bad_lanes = __ballot_sync(kFullWarp, bad), repeated_lanes = __ballot_sync(kFullWarp, repeated);
    if (bad_lanes != 0 && k == __ffs(bad_lanes) - 1) report_data_error(launch, device::kErrorBadExpert, id, launch.experts);
    if (repeated_lanes != 0 && k == __ffs(repeated_lanes) - 1) {
      report_data_error(launch, device::kErrorRepeatedExpert, id, static_cast<long long>(t));
    }
  }
  return repeated ? -1 : expert;
}

// The sending half, a warp per (token, slice of its lines), each decoding its token itself (no pass before the
// first store). A redispatch reuses the last T and ranks and moves rows and scales only.
template <typename Index, bool kScales>
__device__ uint64_t send_lines(const MoeLaunch& launch, uint32_t* block_pairs, PeerTokens* peers) {
  const int me = launch.rank, W = launch.world, K = launch.top_k, L = launch.local_experts;
  const bool reuse = launch.reuse_routing;
  const unsigned int lane = lane_id(), warp = threadIdx.x / 32;
  const size_t tokens = reuse ? static_cast<size_t>(*launch.tokens) : call_tokens(launch);
  const Span range = block_tokens(tokens);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (!reuse) *launch.tokens = static_cast<int64_t>(tokens);
    int64_t* received = at_offset<int64_t>(launch.peers[me], launch.layout.received);
    received[me] = received[W + me] = static_cast<int64_t>(tokens);
  }
  if (threadIdx.x == 0) {
    at_offset<uint64_t>(launch.peers[me], launch.layout.block_rows)[size_t(me) * launch.blocks + blockIdx.x] =
        uint64_t(range.begin) << 32 | uint64_t(range.end - range.begin);
  }

  const ExpertRanks expert_ranks(L);
  const uint32_t groups = static_cast<uint32_t>(launch.slot_lines / 4);
  const int slices = slices_for(range.end - range.begin), slice_bits = __ffs(slices) - 1;
  const uint32_t items = static_cast<uint32_t>(range.end - range.begin) * slices;
  // Loaded with the first item's loads: one latency fewer before the first store.
  uint64_t flag = 0;
  uint32_t parity = 0;
  for (uint32_t item = warp;; item += kMoeWarps) {
    const bool first_round = item == warp, has_item = item < items;
    if (!first_round && !has_item) break;
    const uint32_t t = static_cast<uint32_t>(range.begin) + (item >> slice_bits);  // slices is a power of two
    const int slice = static_cast<int>(item & (slices - 1));
    const uint32_t per_slice = (groups + slices - 1) >> slice_bits;
    const uint32_t begin = min(groups, slice * per_slice), end = min(groups, begin + per_slice);
    const bool first_slice = begin == 0;
    // One round of loads.
    int64_t id = -1;
    float weight = 0.0f;
    uint32_t ranks = 0;
    if (!has_item) {
    } else if (reuse) {
      ranks = launch.token_ranks[t];
    } else if (static_cast<int>(lane) < K) {
      id = expert_of<Index>(launch, t, static_cast<int>(lane));
      if (first_slice) weight = launch.topk_weights[t * K + lane];
    }
    uint64_t words[kGroupBatch][2];
    auto load_groups = [&](uint32_t first, int count) {
#pragma unroll
      for (int i = 0; i < kGroupBatch; ++i) {
        words[i][0] = words[i][1] = 0;
        const LinePart where = line_part<kScales>(launch, (first + i) * 4 + lane / 8);
        if (i >= count) continue;
        if (where.row) load_row_part(launch.x + t * launch.row_bytes + where.offset, where.left, words[i]);
        if (where.scales) load_row_part(launch.x_scales + t * launch.scale_bytes + where.offset, where.left, words[i]);
      }
    };
    int count = has_item ? static_cast<int>(min(uint32_t(kGroupBatch), end - begin)) : 0;
    load_groups(begin, count);
    if (first_round) {
      flag = launch.line_epochs[blockIdx.x] + 1;
      parity = flag & 1;
      if (blockIdx.x == 0 && warp == kMoeWarps - 1) {
#pragma unroll 1
        for (int p = 1; p < W; ++p) {
          if (lane < 8) kernels::store_wire16(tokens_line(launch, (me + p) % W, parity, me) + lane * 16, lane == 0 ? tokens : 0, lane == 7 ? flag : 0);
        }
      }
      if (!has_item) break;
    }
    // Only slice 0 needs the experts.
    int expert = -1;
    if (!reuse && first_slice) {
      expert = warp_expert<Index>(launch, id, t, expert_ranks, true, ranks);
    } else if (!reuse) {
      ranks = __reduce_or_sync(kFullWarp, id >= 0 && id < launch.experts ? 1u << expert_ranks.of(static_cast<int>(id)) : 0u);
    }
    if (first_slice) {
      // Line 0 into every peer first: every receiving warp of the slot waits for it.
#pragma unroll 1
      for (int p = 1; p < W; ++p) {
        const int r = (me + p) % W;
        uint64_t metadata[2];
        metadata_line(expert, weight, r, L, (ranks >> r) & 1u ? static_cast<int32_t>(t) : -1, metadata);
        if (lane < 8) kernels::store_wire16(line_slot(launch, r, parity, me, t) + lane * 16, metadata[0], lane == 7 ? flag : metadata[1]);
      }
      if (!reuse) {
        if (expert >= me * L && expert < (me + 1) * L) atomicAdd(&block_pairs[expert - me * L], 1u);
        if (lane == 0) launch.token_ranks[t] = ranks;
        write_own_metadata(launch, t, expert, weight);
      }
    }
    if (ranks == 0) continue;
    for (uint32_t first = begin; first < end; first += kGroupBatch) {
      if (first != begin) {
        count = static_cast<int>(min(uint32_t(kGroupBatch), end - first));
        load_groups(first, count);
      }
      if ((ranks >> me) & 1u) {
        const size_t row = size_t(me) * launch.max_tokens + t;
        char* base = launch.peers[me];
#pragma unroll
        for (int i = 0; i < kGroupBatch; ++i) {
          const LinePart where = line_part<kScales>(launch, (first + i) * 4 + lane / 8);
          if (i >= count) continue;
          if (where.row) store_row_part(base + launch.layout.rows + row * launch.row_bytes + where.offset, where.left, words[i]);
          if (where.scales) store_row_part(base + launch.layout.row_scales + row * launch.scale_bytes + where.offset, where.left, words[i]);
        }
      }
      // Rolled (instruction-cache lines).
#pragma unroll 1
      for (int p = 1; p < W; ++p) {
        const int r = (me + p) % W;
        if (((ranks >> r) & 1u) == 0) continue;
        char* wire = line_slot(launch, r, parity, me, t) + first * kLL128WarpWire + lane * 16;
#pragma unroll
        for (int i = 0; i < kGroupBatch; ++i) {
          if (i >= count || (first + i == 0 && lane < 8)) continue;  // line 0 went above
          kernels::store_wire16(wire + i * kLL128WarpWire, words[i][0], (lane & 7u) == 7u ? flag : words[i][1]);
        }
      }
    }
  }
  // The last warp reads the peers' T once its rows are on their way, so a wait for a peer holds back no store.
  if (warp == kMoeWarps - 1 && launch.phase == kWholeCall) read_peer_tokens(launch, flag, peers);
  return flag;
}

// The receiving half; with `cleared`, thread 0 then waits for the counts' clearing while other warps receive.
// False on every thread once a wait gave up.
template <typename Index, bool kScales>
__device__ bool receive_lines(const MoeLaunch& launch, uint64_t flag, uint32_t* block_pairs, PeerTokens* peers, int* cleared) {
  const int me = launch.rank, W = launch.world;
  const bool reuse = launch.reuse_routing;
  const uint32_t parity = flag & 1;
  const unsigned int lane = lane_id(), warp = threadIdx.x / 32;
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  if (peers->state == 0) {  // a split call
    if (warp == 0) read_peer_tokens(launch, flag, peers);
    __syncthreads();
  }
  if (peers->state != 1) return false;
  uint32_t tokens_here = 0;
#pragma unroll 1
  for (int p = 1; p < W; ++p) {
    const Span range = block_tokens(peers->tokens[p]);
    tokens_here += static_cast<uint32_t>(range.end - range.begin);
  }
  const uint32_t groups = static_cast<uint32_t>(launch.slot_lines / 4);
  const int slices = slices_for(tokens_here), slice_bits = __ffs(slices) - 1;
  const uint32_t items = tokens_here * slices;
  for (uint32_t item = warp; item < items; item += kMoeWarps) {
    uint32_t u = item >> slice_bits;  // slices is a power of two
    int p = 1;
    Span range = block_tokens(peers->tokens[1]);
#pragma unroll 1
    while (u >= range.end - range.begin && p + 1 < W) {
      u -= range.end - range.begin;
      ++p;
      range = block_tokens(peers->tokens[p]);
    }
    const int slice = static_cast<int>(item & (slices - 1));
    const int s = (me + p) % W;
    const uint32_t t = static_cast<uint32_t>(range.begin) + u;
    const char* wire = line_slot(launch, me, parity, s, t) + lane * 16;
    kernels::WarpPollBound bound(launch.pad, launch.dispatch_id, kSiteMoeRows, s);
    const uint32_t per_slice = (groups + slices - 1) >> slice_bits;
    const uint32_t begin = min(groups, slice * per_slice), end = min(groups, begin + per_slice);
    uint64_t metadata[2] = {0, 0}, words[kPollBatch][2];
    int32_t token = -1;
    int count = static_cast<int>(min(uint32_t(kPollBatch), end - begin));
    if (!poll_slot(wire, wire + begin * kLL128WarpWire, count, flag, bound, metadata, words, token)) {
      if (lane == 0) failed = 1;
      break;
    }
    const int64_t row = int64_t(s) * int64_t(launch.max_tokens) + int64_t(t);
    if (begin == 0 && !reuse) write_metadata(launch, row, s, token, metadata, block_pairs);
    if (token < 0) continue;  // a hole
    char* rows = launch.peers[me] + launch.layout.rows + size_t(row) * launch.row_bytes;
    char* scales = launch.peers[me] + launch.layout.row_scales + size_t(row) * launch.scale_bytes;
    bool stop = false;
    for (uint32_t first = begin; first < end; first += kPollBatch) {
      if (first != begin) {
        count = static_cast<int>(min(uint32_t(kPollBatch), end - first));
        if (!kernels::poll_groups(wire + first * kLL128WarpWire, kLL128WarpWire, count, true, flag, bound, words)) {
          stop = true;
          break;
        }
      }
#pragma unroll
      for (int i = 0; i < kPollBatch; ++i) {
        if (i >= count) continue;
        const LinePart where = line_part<kScales>(launch, (first + i) * 4 + lane / 8);
        if (where.row) store_row_part(rows + where.offset, where.left, words[i]);
        if (where.scales) store_row_part(scales + where.offset, where.left, words[i]);
      }
    }
    if (stop) {
      if (lane == 0) failed = 1;
      break;
    }
  }
  if (cleared != nullptr && threadIdx.x == 0) *cleared = counts_are_cleared(launch, flag) ? 1 : 0;
  __syncthreads();
  return failed == 0;
}

template <typename Index, bool kScales>
__global__ void __launch_bounds__(kMoeThreads, kMoeBlocksPerSm) moe_line_dispatch(MoeLaunch launch) {
  __shared__ uint32_t block_pairs[kMaxExperts];
  kernels::start_dependent_kernel();  // the last call on the buffer, and this block's last sequence
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const bool routed = !launch.reuse_routing;
  __shared__ int cleared;  // block 0 cleared this dispatch's counts
  __shared__ PeerTokens peers;
  if (threadIdx.x == 0) peers.state = 0;
  for (int j = threadIdx.x; j < launch.local_experts; j += blockDim.x) block_pairs[j] = 0;
  uint64_t flag;
  if (launch.phase != kReceivingHalf) {
    __syncthreads();
    flag = send_lines<Index, kScales>(launch, block_pairs, &peers);
    if (routed && blockIdx.x == 0) clear_counts(launch, flag);
  } else {
    flag = launch.line_epochs[blockIdx.x] + 1;
  }
  if (launch.phase == kSendingHalf) {
    if (routed && threadIdx.x == 0) cleared = counts_are_cleared(launch, flag) ? 1 : 0;
    if (routed) add_pairs_to_counts(launch, cleared, block_pairs);
    return;
  }
  // By now the wait is one load.
  if (!receive_lines<Index, kScales>(launch, flag, block_pairs, &peers, routed ? &cleared : nullptr)) return;
  if (routed && !add_pairs_to_counts(launch, cleared, block_pairs)) return;
  // NOTE [line sequence]: only this block reads it, at its start.
  if (threadIdx.x == 0) {
    launch.line_epochs[blockIdx.x] = flag;
    launch.combine_plan[2] = 1;  // a dispatch with no combine after it yet
  }
}

}  // namespace

void launch_line_dispatch(const MoeLaunch& launch, DataType index_type, cudaStream_t stream) {
  auto kernel = index_type == DataType::kInt64
                    ? (launch.scale_bytes != 0 ? moe_line_dispatch<int64_t, true> : moe_line_dispatch<int64_t, false>)
                    : (launch.scale_bytes != 0 ? moe_line_dispatch<int32_t, true> : moe_line_dispatch<int32_t, false>);
  kernels::launch_dependent(kernel, launch.blocks, kMoeThreads, stream, launch);
}

}  // namespace braid::kernels::moe

BRAID_KERNEL_MODULE()

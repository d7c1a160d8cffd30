// MoE dispatch, expert-major layout, two launches (docs/dev/moe.md, "Expert-major dispatch"):
//   1. route: numbers this rank's pairs per expert and tokens per destination in token order, and writes the
//      counts, tagged, into every rank's count matrix.
//   2. scatter: once the tags match, every rank computes every rank's layout; rows move in rounds, a token once
//      into each peer (at its first expert's row there), then expanded there into its other rows.
// A destination whose rows would exceed the capacity gets none (every sender sees the same layout) and reports
// it; ids outside [-1, E) are skipped and reported; T above max_tokens sends nothing.
#include <cub/block/block_scan.cuh>

#include "braid/moe_shape.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/launch_counter.cuh"
#include "kernels/staged.cuh"
#include "core/kernel_modules.hpp"
#include "kernels/moe_kernels.hpp"
#include "kernels/moe_layout.cuh"
#include "kernels/moe_plan.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels::moe {
namespace {

using kernels::group_copy_to;

constexpr unsigned int kFullWarp = 0xffffffffu;

__device__ __forceinline__ unsigned int lane() { return threadIdx.x & 31u; }

constexpr int kRawVectors = kMaxTopK * sizeof(int64_t) / 16;
struct RawIds {
  uint4 v[kRawVectors];
};

template <typename Index>
__device__ __forceinline__ void decode_ids(const MoeLaunch& launch, const RawIds& raw, size_t t, size_t tokens,
                                           bool reporter, int32_t (&ids)[kMaxTopK]) {
  decode_expert_ids(launch, [&](int k) -> int64_t {
    return k < launch.top_k && t < tokens ? reinterpret_cast<const Index*>(raw.v)[k] : -1;
  }, reporter, ids);
}

// The route's last block: repeated pairs get slot -1 (no row) and are reported, off the counting blocks' path.
template <typename Index>
__device__ void mark_repeats(const MoeLaunch& launch, size_t tokens) {
  const int K = launch.top_k;
  for (size_t t = threadIdx.x; t < tokens; t += blockDim.x) {
    int32_t ids[kMaxTopK];
    decode_expert_ids(launch, [&](int k) -> int64_t { return k < K ? expert_of<Index>(launch, t, k) : -1; }, false, ids);
    const uint32_t repeats = repeated_ids(launch, ids, t, true);
    for (uint32_t left = repeats; left != 0; left &= left - 1) launch.pair_slot[t * K + __ffs(left) - 1] = -1;
  }
}

template <typename Index>
__global__ void __launch_bounds__(kMoeThreads) moe_route(MoeLaunch launch) {
  using Scan = cub::BlockScan<int, kMoeThreads>;
  __shared__ typename Scan::TempStorage scan;
  kernels::start_dependent_kernel();  // the last combine or dispatch (combine_plan, epoch)
  const size_t tokens = call_tokens(launch);
  if (blockIdx.x == static_cast<unsigned>(launch.experts + launch.world)) {
    mark_repeats<Index>(launch, tokens);
    return;
  }
  const int K = launch.top_k, L = launch.local_experts;
  const bool expert_block = blockIdx.x < static_cast<unsigned>(launch.experts);
  const int target = expert_block ? blockIdx.x : blockIdx.x - launch.experts;  // expert, or destination rank
  const bool reporter = !expert_block && target == 0;  // reports bad ids, writes token_ranks
  const int low = expert_block ? target : target * L, high = expert_block ? target + 1 : low + L;  // its experts
  const ExpertRanks expert_ranks(L);
  // Ids loaded together and kept raw until used: the next chunk's loads stay in flight behind this chunk's scan.
  const bool vectors = (K * sizeof(Index)) % 16 == 0 && reinterpret_cast<uintptr_t>(launch.topk_idx) % 16 == 0;
  const int vectors_per_token = static_cast<int>(K * sizeof(Index) / 16);
  auto load_raw = [&](size_t t, RawIds& raw) {
    if (t >= tokens) return;
    if (vectors) {
      const uint4* from = static_cast<const uint4*>(launch.topk_idx) + t * vectors_per_token;
#pragma unroll
      for (int v = 0; v < kRawVectors; ++v) {
        if (v < vectors_per_token) raw.v[v] = from[v];
      }
    } else {
      Index* ids = reinterpret_cast<Index*>(raw.v);
#pragma unroll
      for (int k = 0; k < kMaxTopK; ++k) {
        if (k < K) ids[k] = static_cast<const Index*>(launch.topk_idx)[t * K + k];
      }
    }
  };
  auto decode = [&](size_t t, const RawIds& raw, int32_t (&ids)[kMaxTopK]) {
    decode_ids<Index>(launch, raw, t, tokens, reporter, ids);
  };
  int32_t ids[kMaxTopK];
  RawIds raw{};
  load_raw(threadIdx.x, raw);
  decode(threadIdx.x, raw, ids);
  int64_t running = 0;
  for (size_t chunk = 0; chunk < tokens; chunk += kMoeThreads) {
    const size_t t = chunk + threadIdx.x;
    load_raw(t + kMoeThreads, raw);
    uint32_t ranks = 0;
    // 0 or 1 (names expert `target`, or goes to rank `target`): no search for repeats.
    int mine = 0;
#pragma unroll
    for (int k = 0; k < kMaxTopK; ++k) {
      mine += ids[k] >= low && ids[k] < high;
      if (reporter && ids[k] >= 0) ranks |= 1u << expert_ranks.of(ids[k]);
    }
    mine = mine > 0;
    int before = 0, total = 0;
    Scan(scan).ExclusiveSum(mine, before, total);
    int64_t slot = running + before;
    if (t < tokens) {
      if (expert_block) {
#pragma unroll
        for (int k = 0; k < kMaxTopK; ++k) {
          if (ids[k] == target && mine) {  // the first pair naming the expert
            launch.pair_slot[t * K + k] = static_cast<int32_t>(slot);
            mine = 0;
          }
        }
      } else {
        if (mine) launch.slot_token[size_t(target) * launch.max_tokens + slot] = static_cast<int32_t>(t);
        if (reporter) launch.token_ranks[t] = ranks;
      }
    }
    running += total;
    decode(t + kMoeThreads, raw, ids);  // waits for the next chunk's loads
    __syncthreads();  // the scan's storage is reused
  }
  if (threadIdx.x < static_cast<unsigned>(launch.world)) {
    // Parity = dispatches so far: a fast rank's next dispatch never overwrites counts a slow rank still reads.
    // No fence or flag (count_tag_of).
    const uint64_t epoch = *launch.epoch;
    device::store_relaxed_system(&count_row(launch, threadIdx.x, epoch & 1, launch.rank)[blockIdx.x],
                                 count_tag_of(epoch) | static_cast<uint64_t>(running));
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    *launch.tokens = static_cast<int64_t>(tokens);
    launch.combine_plan[3] = launch.combine_plan[2];  // the last call was a dispatch: scatter's entry barrier
    launch.combine_plan[2] = 1;                       // no combine after this dispatch yet
  }
}

// The plans (the same on every rank), and what this rank sends and receives.
struct Rounds {
  ScatterPlan scatter;
  CombinePlan combine;
  int64_t sent[kMaxWorld];      // 0 for a rank whose rows overflow
  int64_t received[kMaxWorld];  // 0 when this rank's rows overflow
};
static_assert(kRowVectorBytes == kernels::kVectorBytes, "slices are whole vectors");

// From pairs[s * world + r] (tokens s sends r): plan_rounds_early beside the layout's scans (off the path to the
// first store) assuming every rank's rows fit; plan_rounds_late after, leaving out ranks whose rows overflow.
__device__ __forceinline__ int64_t warp_max(int64_t value) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) value = max(value, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, value, d)));
  return value;
}

__device__ void plan_rounds_early(const MoeLaunch& launch, const int64_t* pairs, Rounds& rounds) {
  const int W = launch.world, lane = static_cast<int>(threadIdx.x % 32);
  int64_t longest = 0, most_received = 0;
  for (int i = lane; i < W * W; i += 32) longest = max(longest, pairs[i]);
  for (int r = lane; r < W; r += 32) {
    int64_t received = 0;
    for (int s = 0; s < W; ++s) received += pairs[s * W + r];
    most_received = max(most_received, received);
  }
  longest = warp_max(longest);
  most_received = warp_max(most_received);
  if (lane == 0) {
    rounds.scatter = plan_scatter(launch.row_bytes, static_cast<uint32_t>(longest), gridDim.x);
    rounds.combine = plan_combine(most_received, gridDim.x);
  }
}

__device__ void plan_rounds_late(const MoeLaunch& launch, const int64_t* pairs, const Layout& layout, Rounds& rounds) {
  const int me = launch.rank, W = launch.world, lane = static_cast<int>(threadIdx.x % 32);
  const int64_t capacity = static_cast<int64_t>(launch.capacity);
  const bool i_fit = layout.rank_rows[me] <= capacity;
  for (int r = lane; r < W; r += 32) {
    rounds.sent[r] = layout.rank_rows[r] <= capacity ? pairs[me * W + r] : 0;
    rounds.received[r] = i_fit ? pairs[r * W + me] : 0;
  }
  bool overflow = false;
  for (int r = 0; r < W; ++r) overflow |= layout.rank_rows[r] > capacity;
  if (!overflow || lane != 0) return;
  int64_t most_received = 0;  // ranks whose rows overflowed receive none
  for (int r = 0; r < W; ++r) {
    if (layout.rank_rows[r] > capacity) continue;
    int64_t received = 0;
    for (int s = 0; s < W; ++s) received += pairs[s * W + r];
    most_received = max(most_received, received);
  }
  rounds.combine = plan_combine(most_received, gridDim.x);
}

struct Slice {
  size_t begin, bytes;
};

// Lane q * K + k holds pair k of the q-th rank of a pass: one chain of dependent loads per pass, not per rank.
__device__ __forceinline__ int ranks_per_pass(int top_k) { return 32 / top_k; }
static_assert(kMaxTopK < 32, "a token's pairs are a bit mask of a warp's lanes");
__device__ __forceinline__ unsigned int pair_mask(int top_k) { return (1u << top_k) - 1u; }

// Lane k's pair of the i-th token sent rank r (row -1: not on r); slot and weight are loaded with the id.
struct SentPair {
  int32_t token;
  int expert;
  int64_t row;
  float weight;
};
template <typename Index>
__device__ __forceinline__ SentPair sent_pair(const MoeLaunch& launch, const Layout& layout, int64_t i, int r, int k,
                                              bool weights) {
  const int L = launch.local_experts;
  SentPair pair{launch.slot_token[size_t(r) * launch.max_tokens + i], -1, -1, 0.0f};
  const int64_t id = expert_of<Index>(launch, pair.token, k);
  const int32_t slot = launch.pair_slot[size_t(pair.token) * launch.top_k + k];
  if (weights) pair.weight = launch.topk_weights[size_t(pair.token) * launch.top_k + k];
  pair.expert = id >= 0 && id < launch.experts ? static_cast<int>(id) : -1;
  if (pair.expert >= r * L && pair.expert < (r + 1) * L && slot >= 0) {  // slot -1: a repeated id (the route's)
    pair.row = layout.expert_start[pair.expert] + layout.mine_before[pair.expert] + slot;
  }
  return pair;
}

// One warp, token i of the lists for ranks me + first, first in [first_begin, first_end], a pass at a time:
// visit(first, pair, ballot of lanes with a row); token and row -1 past the range or the list.
template <typename Index, typename Visit>
__device__ __forceinline__ void for_each_sent_pass(const MoeLaunch& launch, const Layout& layout, const Rounds& rounds,
                                                   int64_t i, int first_begin, int first_end, bool weights,
                                                   Visit&& visit) {
  const int K = launch.top_k, me = launch.rank, W = launch.world;
  const int per_pass = ranks_per_pass(K);
  const int group = static_cast<int>(lane()) / K, k = static_cast<int>(lane()) % K;
  for (int first = first_begin; first <= first_end; first += per_pass) {
    const int r = (me + first + group) % W;
    SentPair pair{-1, -1, -1, 0.0f};
    if (group < per_pass && first + group <= first_end && i < rounds.sent[r]) {
      pair = sent_pair<Index>(launch, layout, i, r, k, weights);
    }
    visit(first, pair, __ballot_sync(kFullWarp, pair.row >= 0));
  }
}

// One warp: `slice` of token i for ranks me + first (peers [1, W - 1], this rank W): into a peer once, with the
// record when `record`; into this rank, every row with its metadata.
template <typename Index>
__device__ void send_tokens(const MoeLaunch& launch, const Layout& layout, const Rounds& rounds, int64_t i, Slice slice,
                            bool record, int first_begin, int first_end) {
  const int K = launch.top_k, L = launch.local_experts, me = launch.rank, W = launch.world;
  const int per_pass = ranks_per_pass(K);
  const int group = static_cast<int>(lane()) / K, k = static_cast<int>(lane()) % K;
  const size_t row_bytes = launch.row_bytes;
  for_each_sent_pass<Index>(launch, layout, rounds, i, first_begin, first_end, record, [&](int first, const SentPair& pair,
                                                                                            unsigned int valid_pass) {
    const int32_t t = pair.token;
    const int e = pair.expert;
    const int64_t row = pair.row;
    const float weight = pair.weight;
    for (int q = 0; q < per_pass && first + q <= first_end; ++q) {
      const int32_t token = __shfl_sync(kFullWarp, t, q * K);
      if (token < 0) continue;  // warp-uniform
      const int destination = (me + first + q) % W;
      const unsigned int valid = (valid_pass >> (q * K)) & pair_mask(K);
      const int n = __popc(valid);
      char* base = launch.peers[destination];
      char* rows = base + launch.layout.rows + slice.begin;
      const char* source = launch.x + size_t(token) * row_bytes + slice.begin;
      if (destination != me) {  // the receiver expands it into the token's other rows
        char* primary = rows + __shfl_sync(kFullWarp, row, q * K + __ffs(valid) - 1) * row_bytes;
        group_copy_to(&primary, 1, source, slice.bytes, lane(), 32);
      } else {
        char* destinations[kMaxTopK];
        int d = 0;
        for (int j = 0; j < K; ++j) {
          const int64_t row_j = __shfl_sync(kFullWarp, row, q * K + j);
          if ((valid >> j) & 1u) destinations[d++] = rows + row_j * row_bytes;
        }
        group_copy_to(destinations, n, source, slice.bytes, lane(), 32);
      }
      if (!record) continue;

      int32_t* words = at_offset<int32_t>(base, launch.layout.records) + (size_t(me) * launch.max_tokens + i) * record_words(K);
      if (static_cast<int>(lane()) == q * K) {
        words[0] = token;
        words[1] = n;
      }
      if (group == q && row >= 0) {
        const int position = __popc(valid & ((1u << k) - 1u));
        const int32_t expert = e - destination * L;
        words[2 + position] = static_cast<int32_t>(row);
        words[2 + K + position] = __float_as_int(weight);
        words[2 + 2 * K + position] = expert;
        if (destination == me) {
          at_offset<float>(base, launch.layout.row_weight)[row] = weight;
          at_offset<int32_t>(base, launch.layout.row_expert)[row] = expert;
          at_offset<int32_t>(base, launch.layout.row_rank)[row] = me;
          at_offset<int32_t>(base, launch.layout.row_token)[row] = token;
        }
      }
    }
  });
}

// One warp: received token i's slice into its other rows, and with `metadata` the rows' metadata.
__device__ void expand_tokens(const MoeLaunch& launch, const Rounds& rounds, int64_t i, Slice slice, bool metadata) {
  const int K = launch.top_k, me = launch.rank, W = launch.world;
  const int per_pass = ranks_per_pass(K);
  const int group = static_cast<int>(lane()) / K, k = static_cast<int>(lane()) % K;
  const size_t row_bytes = launch.row_bytes;
  char* base = launch.peers[me];
  const int32_t* records = at_offset<int32_t>(base, launch.layout.records);
  for (int first = 1; first < W; first += per_pass) {
    const int source = (me + first + group) % W;
    int32_t token = -1, n = 0, row = -1, weight_bits = 0, expert = -1;
    if (group < per_pass && first + group < W && i < rounds.received[source]) {
      const int32_t* words = records + (size_t(source) * launch.max_tokens + i) * record_words(K);
      token = words[0];
      n = min(max(words[1], 0), K);
      row = words[2 + k];
      if (metadata) {
        weight_bits = words[2 + K + k];
        expert = words[2 + 2 * K + k];
      }
      if (k >= n) row = -1;
    }
    for (int q = 0; q < per_pass && first + q < W; ++q) {
      const int count = __shfl_sync(kFullWarp, n, q * K);
      if (count > 1) {
        char* rows = base + launch.layout.rows + slice.begin;
        char* destinations[kMaxTopK];
        for (int j = 1; j < count; ++j) destinations[j - 1] = rows + size_t(__shfl_sync(kFullWarp, row, q * K + j)) * row_bytes;
        group_copy_to(destinations, count - 1, rows + size_t(__shfl_sync(kFullWarp, row, q * K)) * row_bytes, slice.bytes,
                      lane(), 32);
      }

      if (metadata && group == q && row >= 0) {
        at_offset<float>(base, launch.layout.row_weight)[row] = __int_as_float(weight_bits);
        at_offset<int32_t>(base, launch.layout.row_expert)[row] = expert;
        at_offset<int32_t>(base, launch.layout.row_rank)[row] = (me + first + q) % W;
        at_offset<int32_t>(base, launch.layout.row_token)[row] = token;
      }
    }
  }
}

// fp8 scales move apart from the rows (in the row loops scatter spilled), by the warp of the last slice.

// One warp: `bytes` into the rows of `area` that lanes first_lane + j hold in `row`, for bits j of `rows`.
template <typename Word>
__device__ __forceinline__ void copy_to_rows(const char* from, char* area, size_t bytes, int64_t row, int first_lane,
                                             unsigned int rows) {
  const size_t words = bytes / sizeof(Word);
  for (size_t w0 = 0; w0 < words; w0 += 32) {
    const size_t w = w0 + lane();
    Word value{};
    if (w < words) value = reinterpret_cast<const Word*>(from)[w];
    for (unsigned int left = rows; left != 0; left &= left - 1) {
      const int64_t to = __shfl_sync(kFullWarp, row, first_lane + __ffs(left) - 1);
      if (w < words) reinterpret_cast<Word*>(area + to * bytes)[w] = value;
    }
  }
}

// Scales are a multiple of 4 bytes (kMoeScaleColumns); 16-byte vectors where the addresses allow.
__device__ __forceinline__ void copy_scales(const char* from, char* area, size_t bytes, int64_t row, int first_lane,
                                            unsigned int rows) {
  if (bytes % 16 == 0 && reinterpret_cast<uintptr_t>(from) % 16 == 0) {
    copy_to_rows<uint4>(from, area, bytes, row, first_lane, rows);
  } else {
    copy_to_rows<uint32_t>(from, area, bytes, row, first_lane, rows);
  }
}

// Token i's scales into the rows send_tokens filled.
template <typename Index>
__device__ void send_scales(const MoeLaunch& launch, const Layout& layout, const Rounds& rounds, int64_t i, int first_begin,
                            int first_end) {
  const int K = launch.top_k, me = launch.rank, W = launch.world;
  const int per_pass = ranks_per_pass(K);
  const size_t bytes = launch.scale_bytes;
  for_each_sent_pass<Index>(launch, layout, rounds, i, first_begin, first_end, false, [&](int first, const SentPair& pair,
                                                                                           unsigned int valid_pass) {
    for (int q = 0; q < per_pass && first + q <= first_end; ++q) {
      const int32_t token = __shfl_sync(kFullWarp, pair.token, q * K);
      unsigned int rows = (valid_pass >> (q * K)) & pair_mask(K);
      if (token < 0 || rows == 0) continue;  // warp-uniform
      const int destination = (me + first + q) % W;
      if (destination != me) rows &= ~rows + 1u;  // the first only
      copy_scales(launch.x_scales + size_t(token) * bytes, launch.peers[destination] + launch.layout.row_scales, bytes,
                  pair.row, q * K, rows);
    }
  });
}

// Received token i's scales into its other rows.
__device__ void expand_scales(const MoeLaunch& launch, const Rounds& rounds, int64_t i) {
  const int K = launch.top_k, me = launch.rank, W = launch.world;
  const int per_pass = ranks_per_pass(K);
  const int group = static_cast<int>(lane()) / K, k = static_cast<int>(lane()) % K;
  const size_t bytes = launch.scale_bytes;
  char* area = launch.peers[me] + launch.layout.row_scales;
  const int32_t* records = at_offset<int32_t>(launch.peers[me], launch.layout.records);
  for (int first = 1; first < W; first += per_pass) {
    const int source = (me + first + group) % W;
    int n = 0;
    int64_t row = -1;
    if (group < per_pass && first + group < W && i < rounds.received[source]) {
      const int32_t* words = records + (size_t(source) * launch.max_tokens + i) * record_words(K);
      n = min(max(words[1], 0), K);
      if (k < n) row = words[2 + k];
    }
    for (int q = 0; q < per_pass && first + q < W; ++q) {
      const int count = __shfl_sync(kFullWarp, n, q * K);
      if (count < 2) continue;  // warp-uniform
      const int64_t primary = __shfl_sync(kFullWarp, row, q * K);
      copy_scales(area + primary * bytes, area, bytes, row, q * K, ((1u << count) - 1u) & ~1u);
    }
  }
}

__device__ void write_outputs(const MoeLaunch& launch, const Layout& layout, const Rounds& rounds) {
  const int me = launch.rank, L = launch.local_experts, first = me * L;
  const int64_t used = layout.rank_rows[me];
  const bool overflow = used > static_cast<int64_t>(launch.capacity);
  if (!overflow) {
    char* base = launch.peers[me];
    for (int j = blockIdx.x; j < L; j += gridDim.x) {
      const int64_t from = layout.expert_start[first + j] + layout.expert_rows[first + j];
      const int64_t to = align_rows(from, launch.alignment);
      for (int64_t row = from + threadIdx.x; row < to; row += blockDim.x) {
        at_offset<float>(base, launch.layout.row_weight)[row] = 0.0f;
        at_offset<int32_t>(base, launch.layout.row_expert)[row] = -1;
        at_offset<int32_t>(base, launch.layout.row_rank)[row] = -1;
        at_offset<int32_t>(base, launch.layout.row_token)[row] = -1;
      }
    }
  }
  if (blockIdx.x != 0) return;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    launch.expert_counts[j] = layout.expert_rows[first + j];
    launch.expert_offsets[j] = layout.expert_start[first + j];
  }
  if (threadIdx.x == 0) {
    launch.expert_offsets[L] = used;
    launch.combine_plan[0] = rounds.combine.blocks;
    launch.combine_plan[1] = rounds.combine.pieces;
  }
  if (threadIdx.x < launch.world) launch.received_tokens[threadIdx.x] = rounds.received[threadIdx.x];
  if (overflow && threadIdx.x == 0) {
    report_data_error(launch, device::kErrorOverflow, used, static_cast<long long>(launch.capacity));
  }
  if (threadIdx.x == 0) {
    uint32_t delivered = 0;
    for (int r = 0; r < launch.world; ++r) {
      if (layout.rank_rows[r] <= static_cast<int64_t>(launch.capacity)) delivered |= 1u << r;
    }
    *launch.delivered_ranks = delivered;
  }
}

// kScales: fp8, a kernel of its own so the others keep their registers.
template <typename Index, bool kScales>
__global__ void __launch_bounds__(kMoeThreads, kMoeBlocksPerSm) moe_scatter(MoeLaunch launch) {
  __shared__ Layout layout;
  __shared__ Rounds rounds;
  __shared__ int failed;
  kernels::start_dependent_kernel();  // route
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  if (threadIdx.x == 0) failed = 0;
  const uint64_t epoch = kernels::read_launch_counter(launch.epoch);
  // After a dispatch a peer may still expand it in the rows this one overwrites (implied after a combine).
  if (launch.combine_plan[3] != 0 && !device::barrier(launch.pad, blockIdx.x, launch.dispatch_id, kSiteEntryBarrier)) {
    return;
  }
  // Advanced once every block has read it (by the last thread), so no fence and atomic end the kernel.
  kernels::advance_once_read(launch.epoch, launch.blocks_done, epoch, blockDim.x - 1);
  // Each thread waits (acquire) for some count words' tags; pairs[s][r] keeps the word that matched, not reread.
  __shared__ int64_t pairs[kMaxWorld * kMaxWorld];
  const uint64_t parity = epoch & 1, tag = count_tag_of(epoch);
  const uint64_t* counts = count_matrix(launch, parity);
  const int entries = launch.experts + launch.world;
  for (int w = threadIdx.x; w < launch.world * entries; w += blockDim.x) {
    const int source = w / entries, column = w - source * entries;
    uint64_t seen = 0;
    auto arrived = [&] {
      seen = device::load_acquire_system(counts + w);
      return (seen & ~kCountMask) == tag;
    };
    if (!device::spin_until(launch.pad, arrived, launch.dispatch_id, kSiteMoeCounts, source, blockIdx.x)) {
      failed = 1;
      break;
    }
    if (column >= launch.experts) pairs[source * launch.world + column - launch.experts] = count_value(seen);
  }
  __syncthreads();
  if (failed) return;
  // The __syncthreads published pairs and orders compute_layout's loads after the acquires that saw the tags.
  compute_layout(launch, parity, layout, [&] {
    if (threadIdx.x / 32 == kMoeWarps - 1) plan_rounds_early(launch, pairs, rounds);
  });
  if (threadIdx.x < 32) plan_rounds_late(launch, pairs, layout, rounds);
  __syncthreads();
  const int me = launch.rank, world = launch.world;
  const unsigned int warp = threadIdx.x / 32;
  const size_t row_bytes = launch.row_bytes;
  const int slice_index = static_cast<int>(warp) % rounds.scatter.slices;
  Slice slice{size_t(slice_index) * rounds.scatter.slice_bytes, 0};
  if (slice.begin < row_bytes) slice.bytes = min(rounds.scatter.slice_bytes, row_bytes - slice.begin);
  const bool first_slice = slice_index == 0;
  const bool scales = kScales && slice_index == rounds.scatter.slices - 1;
  const ScatterPlan& plan = rounds.scatter;
  auto token_of = [&](int round, int b) {
    return (int64_t(round) * gridDim.x + b) * plan.per_round + static_cast<int>(warp) / plan.slices;
  };
  // A copier copies block `home`'s own rows; it neither sends, signals nor waits.
  const bool copier = plan.own_apart && static_cast<int>(blockIdx.x) >= plan.active_blocks;
  const int home = static_cast<int>(blockIdx.x) - (copier ? plan.active_blocks : 0);
  const int round_count = home < plan.active_blocks ? plan.rounds : 0;
  for (int round = 0; round <= round_count; ++round) {
    if (round < round_count) {
      const int64_t i = token_of(round, home);
      if (!copier) {
        send_tokens<Index>(launch, layout, rounds, i, slice, first_slice, 1, world - 1);
        if (scales) send_scales<Index>(launch, layout, rounds, i, 1, world - 1);
        __syncthreads();
        if (threadIdx.x < static_cast<unsigned>(world) && static_cast<int>(threadIdx.x) != me) {
          // No fence: the release is cumulative over the rows and records the __syncthreads ordered before it.
          device::signal(launch.pad, blockIdx.x, threadIdx.x);
        }
      }
      // Own rows after the signal (or by a copier): they overlap the release's wait for the peers' stores.
      if (copier || !plan.own_apart) {
        send_tokens<Index>(launch, layout, rounds, i, slice, first_slice, world, world);
        if (scales) send_scales<Index>(launch, layout, rounds, i, world, world);
      }
    }
    if (round > 0 && !copier) {  // the peers' previous round
      if (threadIdx.x < static_cast<unsigned>(world) && static_cast<int>(threadIdx.x) != me &&
          !device::wait(launch.pad, blockIdx.x, threadIdx.x, launch.dispatch_id, kSiteMoeRows)) {
        failed = 1;
      }
      __syncthreads();
      if (failed) return;
      expand_tokens(launch, rounds, token_of(round - 1, home), slice, first_slice);
      if (scales) expand_scales(launch, rounds, token_of(round - 1, home));
    }
  }
  write_outputs(launch, layout, rounds);
}

}  // namespace

void launch_dispatch(const MoeLaunch& launch, DataType index_type, cudaStream_t stream) {
  const bool wide = index_type == DataType::kInt64;
  const int route_blocks = launch.experts + launch.world + 1;  // the last one: mark_repeats
  // Dependent launches: scatter's blocks, which wait on every peer, are all resident before the next kernel's.
  kernels::launch_dependent(wide ? moe_route<int64_t> : moe_route<int32_t>, route_blocks, kMoeThreads, stream, launch);
  const bool scales = launch.scale_bytes != 0;
  auto scatter = wide ? (scales ? moe_scatter<int64_t, true> : moe_scatter<int64_t, false>)
                      : (scales ? moe_scatter<int32_t, true> : moe_scatter<int32_t, false>);
  kernels::launch_dependent(scatter, launch.blocks, kMoeThreads, stream, launch);
}

}  // namespace braid::kernels::moe

BRAID_KERNEL_MODULE()

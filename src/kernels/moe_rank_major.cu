// MoE dispatch and combine, rank-major layout, one launch each (docs/dev/moe.md). A token goes once to each rank of
// its experts, to row source * max_tokens + i, i numbered by the source itself (no count exchange before the first
// store); with fixed rows (MoeShape::low_latency) i is the token's index and rows not received say so.
//
// NOTE [rank-major call order]
// A peer writes this rank's rows only in a dispatch, after its last combine (which waited for this rank's signal,
// given after its use of the rows) or an entry barrier. A peer rewrites its combine_input only after its next
// dispatch, which waits for this rank's blocks (done reading the last combine), or after a barrier between two
// combines. The caller's writes into combine_input precede the combine, so no barrier of it covers them: they
// belong between a dispatch and its combine (moe.hpp; NOTE [combine_input after a combine]).
//
// NOTE [expert_pairs scope]
// A rank's expert_pairs words take adds from its own blocks and every peer's at once. PTX makes atomics on one
// location atomic with each other only when each one's scope includes the other's thread; a peer's thread is on
// another GPU, outside .gpu scope, so every access to these words (the adds, and block 0's read-and-clear) is a
// system-scope atomic, the rank's own included.
#include "braid/moe_shape.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "core/kernel_modules.hpp"
#include "kernels/moe_kernels.hpp"
#include "kernels/moe_layout.cuh"
#include "kernels/moe_warp.cuh"
#include "sync/device_sync.hpp"

namespace braid::kernels::moe {
namespace {

using kernels::group_copy_to;

// Parts of a row in combine, so every block has work: the largest power of two up to kMoeWarps with tokens * parts
// <= blocks. Unit u is part u % parts of token u / parts.
__device__ __forceinline__ int parts_per_token(size_t tokens, int blocks) {
  int parts = 1;
  while (parts < kMoeWarps && tokens * size_t(parts) * 2 <= size_t(blocks)) parts *= 2;
  return parts;
}

template <size_t Unit>
__device__ __forceinline__ Span slice_of_part(size_t length, int part, int parts, int slice, int slices) {
  const Span whole = piece_of<Unit>(length, part, parts);
  const Span piece = piece_of<Unit>(whole.end - whole.begin, slice, slices);
  return {whole.begin + piece.begin, whole.begin + piece.end};
}

// Tokens' ranks (bits) and places, kept by dispatch and loaded by combine while the signal crosses: no row
// address waits on a global load.
constexpr int kBlockTokens = 32;
struct TokenNumbers {
  uint32_t ranks[kBlockTokens];
  int32_t places[kMaxWorld][kBlockTokens];
};

// Where token t's numbers are: `shared`, else token_ranks and token_row (with fixed rows the place is t).
struct Numbers {
  const TokenNumbers* shared;  // null: global memory
  size_t first;                // shared's first token
  bool fixed;

  __device__ __forceinline__ uint32_t ranks(const MoeLaunch& launch, size_t t) const {
    return shared != nullptr ? shared->ranks[t - first] : launch.token_ranks[t];
  }
  // Token t's row on rank r.
  __device__ __forceinline__ int64_t row(const MoeLaunch& launch, int r, size_t t) const {
    if (fixed) return int64_t(launch.rank) * int64_t(launch.max_tokens) + int64_t(t);
    const int32_t place = shared != nullptr ? shared->places[r][t - first] : launch.token_row[size_t(r) * launch.max_tokens + t];
    return int64_t(launch.rank) * int64_t(launch.max_tokens) + place;
  }
};

// Per warp, an item's addresses on its ranks, compacted, in shared memory: in registers, an array indexed by a
// count lives on the stack.
template <typename Pointer>
using WarpAddresses = Pointer[kMoeWarps][kMaxWorld];

// One warp: addresses[0, n) = address(r) for the ranks r of `ranks` in order; returns n.
template <typename Pointer, typename Address>
__device__ __forceinline__ int gather_addresses(Pointer* addresses, uint32_t ranks, int world, Address&& address) {
  const unsigned int lane = lane_id();
  const bool mine = static_cast<int>(lane) < world && ((ranks >> lane) & 1u);
  const unsigned int votes = __ballot_sync(kFullWarp, mine);
  if (mine) addresses[__popc(votes & ((1u << lane) - 1u))] = address(static_cast<int>(lane));
  __syncwarp();
  return __popc(votes);
}

// One warp: `bytes` of token t's row into `ranks`, with metadata (`first` slice) and scales (`last`, fp8).
template <typename Index, bool kFixed>
__device__ void move_token(const MoeLaunch& launch, const Numbers& numbers, size_t t, uint32_t ranks, bool first,
                           bool last, Span bytes, char** rows) {
  const int W = launch.world, K = launch.top_k, L = launch.local_experts;
  const unsigned int lane = lane_id();
  __syncwarp();  // the last item's readers of `rows` are done
  int n = gather_addresses(rows, ranks, W, [&](int r) {
    return launch.peers[r] + launch.layout.rows + numbers.row(launch, r, t) * launch.row_bytes + bytes.begin;
  });
  // With fixed rows every rank's row gets metadata, "not here" where the token does not go.
  if (n == 0 && !(kFixed && first && !launch.reuse_routing)) return;
  if (n > 0) group_copy_to(rows, n, launch.x + t * launch.row_bytes + bytes.begin, bytes.end - bytes.begin, lane, 32);
  if (first && !launch.reuse_routing) {
    const int expert = lane_expert<Index>(launch, t);
    const float weight = static_cast<int>(lane) < K ? launch.topk_weights[t * K + lane] : 0.0f;
    for (int r = 0; r < W; ++r) {
      const bool sent = (ranks >> r) & 1u;
      if (!sent && !kFixed) continue;
      char* base = launch.peers[r];
      const int64_t row = numbers.row(launch, r, t);
      if (static_cast<int>(lane) < K) {
        const bool here = expert >= r * L && expert < (r + 1) * L;  // never where the token does not go
        at_offset<int32_t>(base, launch.layout.topk_expert)[row * K + lane] = here ? expert - r * L : -1;
        at_offset<float>(base, launch.layout.topk_weight)[row * K + lane] = here ? weight : 0.0f;
      }
      if (lane == 0) {
        at_offset<int32_t>(base, launch.layout.row_token)[row] = sent ? static_cast<int32_t>(t) : -1;
        at_offset<int32_t>(base, launch.layout.row_rank)[row] = sent ? launch.rank : -1;
      }
    }
  }
  if (n == 0) return;
  if (launch.scale_bytes != 0 && last) {
    __syncwarp();
    n = gather_addresses(rows, ranks, W, [&](int r) {
      return launch.peers[r] + launch.layout.row_scales + numbers.row(launch, r, t) * launch.scale_bytes;
    });
    group_copy_to(rows, n, launch.x_scales + t * launch.scale_bytes, launch.scale_bytes, lane, 32);
  }
}

template <typename Index, bool kFixed>
__device__ void move_tokens(const MoeLaunch& launch, const Numbers& numbers, Span range) {
  __shared__ WarpAddresses<char*> rows;
  const int slices = slices_for(range.end - range.begin);
  const size_t items = (range.end - range.begin) * slices;
  for (size_t item = threadIdx.x / 32; item < items; item += kMoeWarps) {
    const size_t t = range.begin + item / slices;
    const int slice = static_cast<int>(item % slices);
    const Span bytes = piece_of<kernels::kVectorBytes>(launch.row_bytes, slice, slices);
    move_token<Index, kFixed>(launch, numbers, t, numbers.ranks(launch, t), slice == 0, slice == slices - 1, bytes,
                      rows[threadIdx.x / 32]);
  }
}

// The entry barrier (block b with block b of every peer, channel b) in two halves, so the work before the first
// access to peer memory runs while the signals cross. The last warp signals: a release stalls its warp.
__device__ __forceinline__ int entry_peer(const device::SignalPad& pad) {
  const int peer = static_cast<int>(threadIdx.x) - static_cast<int>(blockDim.x) + 32;
  return peer >= 0 && peer < pad.world && peer != pad.rank ? peer : -1;
}

// Its promise (done with what peers overwrite) holds at the start: the kernels before are complete.
__device__ __forceinline__ void arrive_at_entry(const device::SignalPad& pad) {
  const int peer = entry_peer(pad);
  if (peer >= 0) device::signal(pad, blockIdx.x, peer);
}

// Every thread calls it; false on all when a wait failed (recorded for the host).
__device__ inline bool await_entry(const device::SignalPad& pad, unsigned int collective) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int peer = entry_peer(pad);
  if (peer >= 0 && !device::wait(pad, blockIdx.x, peer, collective, kSiteEntryBarrier)) failed = 1;
  __syncthreads();
  return failed == 0;
}

template <typename Index, bool kFixed>
__device__ bool send_rows(const MoeLaunch& launch, uint32_t* block_pairs, uint32_t (*warp_votes)[kMaxWorld],
                          int64_t* before, int64_t* in_range);

// A token's pairs into the block's counts, but the refused repeats.
__device__ __forceinline__ void add_pairs(uint32_t* block_pairs, const int32_t (&ids)[kMaxTopK], uint32_t repeats) {
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) {
    if (ids[k] >= 0 && ((repeats >> k) & 1u) == 0) atomicAdd(&block_pairs[ids[k]], 1u);
  }
}

template <typename Index, bool kFixed>
__global__ void __launch_bounds__(kMoeThreads, kMoeBlocksPerSm) moe_rank_dispatch(MoeLaunch launch) {
  __shared__ uint32_t block_pairs[kMaxExperts];
  __shared__ uint32_t warp_votes[kMoeWarps][kMaxWorld];  // per destination, lanes whose token goes there
  __shared__ int64_t before[kMaxWorld];                   // earlier chunks' tokens per destination
  __shared__ int64_t in_range[kMaxWorld];                 // the block's tokens per destination
  kernels::start_dependent_kernel();  // the last call on the buffer (combine_plan, token_row)
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int me = launch.rank, W = launch.world, L = launch.local_experts;
  bool entry_barrier = false;
  if (launch.phase != kReceivingHalf) {
    entry_barrier = send_rows<Index, kFixed>(launch, block_pairs, warp_votes, before, in_range);
    // No peer's signal covers this rank's own pair adds: each block counts itself in.
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(launch.blocks_done, 1u);
    }
  }
  // Block 0 waits for every block of every peer and of this rank; its end tells the next kernel all is here.
  if (launch.phase == kSendingHalf || blockIdx.x != 0) return;
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  // Thread 0's wait for this rank's blocks is bounded like a peer wait naming this rank (a block may never be
  // scheduled). After an entry barrier the peers' waits follow it: block b waited on channel b there, and one
  // thread waits per channel and peer at a time.
  if (threadIdx.x == 0) {
    if (device::spin_until(launch.pad, [&] { return atomicAdd(launch.blocks_done, 0u) == gridDim.x; },
                           launch.dispatch_id, kSiteMoeRows, me, blockIdx.x)) {
      *launch.blocks_done = 0;
      __threadfence();
    } else {
      failed = 1;
    }
  }
  if (entry_barrier) {
    __syncthreads();
    if (failed) return;
  }
  const int waits = static_cast<int>(gridDim.x) * W;
  for (int i = static_cast<int>(threadIdx.x) - 32; i >= 0 && i < waits; i += static_cast<int>(blockDim.x) - 32) {
    const int channel = i / W, peer = i % W;
    if (peer != me && !device::wait(launch.pad, channel, peer, launch.dispatch_id, kSiteMoeRows)) failed = 1;
  }
  __syncthreads();
  if (failed) return;
  unsigned int* pairs = at_offset<unsigned int>(launch.peers[me], launch.layout.expert_pairs);
  if (!launch.reuse_routing) {  // system scope: NOTE [expert_pairs scope]
    for (int j = threadIdx.x; j < L; j += blockDim.x) launch.expert_counts[j] = atomicExch_system(pairs + j, 0u);
  }
  if (threadIdx.x == 0) launch.combine_plan[2] = 1;  // a dispatch with no combine after it yet
}

// Dispatch's sending half: entry barrier (after a dispatch), numbering, rows, signal. Returns whether it passed
// an entry barrier (early when it failed). A redispatch reuses the last T and numbering.
template <typename Index, bool kFixed>
__device__ bool send_rows(const MoeLaunch& launch, uint32_t* block_pairs, uint32_t (*warp_votes)[kMaxWorld],
                          int64_t* before, int64_t* in_range) {
  const int me = launch.rank, W = launch.world, K = launch.top_k;
  // After a dispatch peers may still read the rows this one overwrites (NOTE [rank-major call order]).
  const bool after_dispatch = launch.combine_plan[2] != 0;
  const bool reuse = launch.reuse_routing;
  const size_t tokens = reuse ? static_cast<size_t>(*launch.tokens) : call_tokens(launch);
  const Span range = piece_of<1>(tokens, blockIdx.x, gridDim.x);
  __shared__ TokenNumbers numbered;
  const Numbers numbers{!reuse && range.end - range.begin <= kBlockTokens ? &numbered : nullptr, range.begin,
                        kFixed};
  // The block holding the last token scans every token: it reports refused ids (once) and the totals.
  const bool reporter = tokens > 0 ? range.begin < range.end && range.end == tokens : blockIdx.x == 0;
  for (int e = threadIdx.x; e < launch.experts; e += blockDim.x) block_pairs[e] = 0;
  if (threadIdx.x < kMaxWorld) before[threadIdx.x] = in_range[threadIdx.x] = 0;
  if (!reuse && blockIdx.x == 0 && threadIdx.x == 0) *launch.tokens = static_cast<int64_t>(tokens);
  __syncthreads();
  if (after_dispatch) arrive_at_entry(launch.pad);  // awaited before the first store into a peer

  // Numbering: a thread per token of [0, end), a ballot per destination and warp (issue-bound at small T).
  const ExpertRanks expert_ranks(launch.local_experts);
  const unsigned int warp = threadIdx.x / 32, lane = lane_id();
  const bool numbering = !reuse && range.begin < range.end && !kFixed;
  if (kFixed && !reuse) {
    // Fixed rows: a thread per token of the block alone; each block reports its own refused ids.
    for (size_t t = range.begin + threadIdx.x; t < range.end; t += blockDim.x) {
      int32_t ids[kMaxTopK];
      decode_expert_ids(launch, [&](int k) -> int64_t { return k < K ? expert_of<Index>(launch, t, k) : -1; }, true, ids);
      const uint32_t ranks = expert_ranks.ranks_of(ids);
      launch.token_ranks[t] = ranks;
      if (numbers.shared != nullptr) numbered.ranks[t - range.begin] = ranks;
      add_pairs(block_pairs, ids, repeated_ids(launch, ids, t, true));
    }
    // The block's rows on every rank: its tokens' (holes included).
    if (threadIdx.x < static_cast<unsigned>(W)) {
      before[threadIdx.x] = static_cast<int64_t>(range.end);
      in_range[threadIdx.x] = static_cast<int64_t>(range.end - range.begin);
    }
    __syncthreads();
  }
  for (size_t chunk = 0; numbering && chunk < range.end; chunk += kMoeThreads) {
    const size_t t = chunk + threadIdx.x;
    int32_t ids[kMaxTopK];
    if (chunk + warp * 32 < range.end) {
      // Repeats stay: they add no rank.
      decode_expert_ids(launch, [&](int k) -> int64_t { return k < K && t < range.end ? expert_of<Index>(launch, t, k) : -1; },
                        reporter, ids);
      const uint32_t ranks = expert_ranks.ranks_of(ids);
      // Rolled: unrolled, each iteration past W jumped over costs an instruction-cache miss.
#pragma unroll 1
      for (int r = 0; r < W; ++r) {
        const unsigned int votes = __ballot_sync(kFullWarp, (ranks >> r) & 1u);
        if (lane == 0) warp_votes[warp][r] = votes;
      }
      if (t >= range.begin && t < range.end) {
        launch.token_ranks[t] = ranks;
        if (numbers.shared != nullptr) numbered.ranks[t - range.begin] = ranks;
      }
    } else if (lane < static_cast<unsigned>(W)) {
      warp_votes[warp][lane] = 0;
    }
    __syncthreads();
    if (t >= range.begin && t < range.end) {
#pragma unroll 1
      for (int r = 0; r < W; ++r) {
        if (((warp_votes[warp][r] >> lane) & 1u) == 0) continue;
        int64_t row = before[r] + __popc(warp_votes[warp][r] & ((1u << lane) - 1u));
        for (unsigned int w = 0; w < warp; ++w) row += __popc(warp_votes[w][r]);
        launch.token_row[size_t(r) * launch.max_tokens + t] = static_cast<int32_t>(row);
        if (numbers.shared != nullptr) numbered.places[r][t - range.begin] = static_cast<int32_t>(row);
        atomicAdd(reinterpret_cast<unsigned long long*>(&in_range[r]), 1ull);
      }
      // Repeats are refused, reported by the token's owner block.
      add_pairs(block_pairs, ids, repeated_ids(launch, ids, t, true));
    }
    __syncthreads();
    if (threadIdx.x < static_cast<unsigned>(W)) {
      int64_t chunk_tokens = 0;
      for (int w = 0; w < kMoeWarps; ++w) chunk_tokens += __popc(warp_votes[w][threadIdx.x]);
      before[threadIdx.x] += chunk_tokens;
    }
    __syncthreads();
  }

  // Everything into the ranks, then the signal, whose release covers it all. The entry signals crossed during the
  // numbering, which touched no peer memory.
  if (after_dispatch && !await_entry(launch.pad, launch.dispatch_id)) return true;
  move_tokens<Index, kFixed>(launch, numbers, range);
  const int L = launch.local_experts;
  for (int e = threadIdx.x; e < launch.experts; e += blockDim.x) {
    if (block_pairs[e] == 0) continue;
    const int r = expert_ranks.of(e);
    unsigned int* pairs = at_offset<unsigned int>(launch.peers[r], launch.layout.expert_pairs) + (e - r * L);
    atomicAdd_system(pairs, block_pairs[e]);  // this rank's own words too: NOTE [expert_pairs scope]
  }
  if (!reuse && threadIdx.x < static_cast<unsigned>(W)) {
    const int r = static_cast<int>(threadIdx.x);
    char* base = launch.peers[r];
    const uint64_t first = static_cast<uint64_t>(before[r] - in_range[r]);
    at_offset<uint64_t>(base, launch.layout.block_rows)[size_t(me) * launch.blocks + blockIdx.x] =
        first << 32 | static_cast<uint64_t>(in_range[r]);
    if (reporter) {
      at_offset<int64_t>(base, launch.layout.received)[me] = before[r];
      at_offset<int64_t>(base, launch.layout.received)[W + me] = static_cast<int64_t>(tokens);
    }
  }
  __syncthreads();
  if (threadIdx.x < static_cast<unsigned>(W) && static_cast<int>(threadIdx.x) != me) {
    device::signal(launch.pad, blockIdx.x, threadIdx.x);
  }
  return after_dispatch;
}

constexpr int kSourceBatch = 4;

// One warp: out[h] = float32 sum of sources[0, n)[h] over `elements`; 16-byte vectors of N, or N = 1.
template <typename T, int N>
__device__ __forceinline__ void sum_rows(const T* const* sources, int n, T* out, Span elements) {
  using A = kernels::acc_t<T>;
  for (size_t h = elements.begin + lane_id() * N; h < elements.end; h += 32 * N) {
    A sum[N] = {};
    if constexpr (N == 1) {
      for (int q = 0; q < n; ++q) sum[0] += kernels::to_acc(sources[q][h]);
      out[h] = kernels::from_acc<T>(sum[0]);
    } else {
      for (int q0 = 0; q0 < n; q0 += kSourceBatch) {
        kernels::Vector<T> loaded[kSourceBatch];
#pragma unroll
        for (int u = 0; u < kSourceBatch; ++u) {
          if (q0 + u < n) loaded[u] = kernels::load_vector<T>(sources[q0 + u] + h);
        }
#pragma unroll
        for (int u = 0; u < kSourceBatch; ++u) {
          if (q0 + u < n) {
#pragma unroll
            for (int i = 0; i < N; ++i) sum[i] += kernels::to_acc(loaded[u].value[i]);
          }
        }
      }
      kernels::Vector<T> result;
#pragma unroll
      for (int i = 0; i < N; ++i) result.value[i] = kernels::from_acc<T>(sum[i]);
      kernels::store_vector<T>(out + h, result);
    }
  }
}

// The block's `units` (parts_per_token).
template <typename T, int N>
__device__ void sum_tokens(const MoeLaunch& launch, const Numbers& numbers, Span units, int parts) {
  const int me = launch.rank, W = launch.world;
  const size_t H = launch.hidden;
  const T* y = reinterpret_cast<const T*>(launch.y);
  T* out = reinterpret_cast<T*>(launch.out);
  __shared__ WarpAddresses<const T*> addresses;
  const T** sources = addresses[threadIdx.x / 32];
  const int slices = slices_for(units.end - units.begin);
  const size_t items = (units.end - units.begin) * slices;
  for (size_t item = threadIdx.x / 32; item < items; item += kMoeWarps) {
    const size_t unit = units.begin + item / slices, t = unit / parts;
    const Span elements = slice_of_part<N>(H, static_cast<int>(unit % parts), parts, static_cast<int>(item % slices), slices);
    __syncwarp();  // the last item's readers of `sources` are done
    const int n = gather_addresses(sources, numbers.ranks(launch, t), W, [&](int r) {
      const int64_t row = numbers.row(launch, r, t);
      return r == me ? y + row * H : at_offset<const T>(launch.peers[r], launch.layout.combine) + row * H;
    });
    sum_rows<T, N>(sources, n, out + t * H, elements);
  }
}

// kGridChannel's signal from `peer`, by every block: pad.expected + 1, moved on once all waited (advance_grid_wait).
__device__ inline bool wait_grid_signal(const device::SignalPad& pad, int peer, unsigned int collective, unsigned int site) {
  const size_t slot = size_t(kGridChannel) * pad.world + peer;
  const uint64_t target = pad.expected[slot] + 1;
  return device::spin_until(pad, [&] { return device::reached(device::load_acquire_system(pad.local + slot), target); },
                            collective, site, peer, kGridChannel);
}

__device__ inline void advance_grid_wait(const device::SignalPad& pad, int peer) {
  pad.expected[size_t(kGridChannel) * pad.world + peer] += 1;
}

template <typename T>
__global__ void __launch_bounds__(kMoeThreads, kMoeBlocksPerSm) moe_rank_combine(MoeLaunch launch) {
  kernels::start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int me = launch.rank, W = launch.world;
  const bool peer_thread = threadIdx.x < static_cast<unsigned>(W) && static_cast<int>(threadIdx.x) != me;
  const size_t row_bytes = launch.hidden * sizeof(T);
  // y is combine_input: earlier (complete) kernels wrote the rows, so block 0 signals first, before any load the
  // release would wait for.
  if (launch.phase != kReceivingHalf && !launch.copy_y && blockIdx.x == 0 && peer_thread) {
    device::signal(launch.pad, kGridChannel, threadIdx.x);
  }
  const bool after_combine = launch.phase != kReceivingHalf && launch.combine_plan[2] == 0;
  if (launch.phase != kReceivingHalf) {
    // Two combines in a row: peers may still read the combine_input this one rewrites (awaited below when none).
    if (after_combine) arrive_at_entry(launch.pad);
    if (after_combine && launch.copy_y && !await_entry(launch.pad, launch.combine_id)) return;
    if (launch.copy_y) {
      char* base = launch.peers[me];
      for (int s = 0; s < W; ++s) {
        if (s == me) continue;  // read from y
        const uint64_t word = at_offset<const uint64_t>(base, launch.layout.block_rows)[size_t(s) * launch.blocks + blockIdx.x];
        const size_t first = size_t(s) * launch.max_tokens + (word >> 32), count = word & 0xffffffffu;
        kernels::block_copy(base + launch.layout.combine + first * row_bytes, launch.y + first * row_bytes, count * row_bytes);
      }
    }
    // The last block to copy signals, once per peer (one from each block costs each a system-scope release). A
    // counter of its own: a block may end before another is done copying.
    if (launch.copy_y && last_block(launch.copies_done)) {
      if (threadIdx.x == 0) *launch.copies_done = 0;
      if (peer_thread) device::signal(launch.pad, kGridChannel, threadIdx.x);
    }
    if (launch.phase == kSendingHalf) {
      if (after_combine && !launch.copy_y) await_entry(launch.pad, launch.combine_id);
      return;
    }
  }
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  const size_t tokens = static_cast<size_t>(*launch.tokens);
  const int parts = parts_per_token(tokens, gridDim.x);
  const Span units = piece_of<1>(tokens * parts, blockIdx.x, gridDim.x);
  // The tokens' numbers into shared memory while the peers' signal crosses.
  const Span mine{units.begin / parts, (units.end + parts - 1) / parts};
  const size_t count = mine.end - mine.begin;
  __shared__ TokenNumbers numbered;
  const Numbers numbers{count <= kBlockTokens ? &numbered : nullptr, mine.begin, launch.fixed_rows};
  const size_t loads = count * (launch.fixed_rows ? 1 : W + 1);
  for (size_t i = threadIdx.x; numbers.shared != nullptr && i < loads; i += blockDim.x) {
    if (i < count) {
      numbered.ranks[i] = launch.token_ranks[mine.begin + i];
    } else {
      const size_t r = (i - count) / count, j = (i - count) % count;
      numbered.places[r][j] = launch.token_row[r * launch.max_tokens + mine.begin + j];
    }
  }
  __syncthreads();
  // A combine that copied nothing awaits its entry barrier here.
  if (peer_thread && after_combine && !launch.copy_y &&
      !device::wait(launch.pad, blockIdx.x, threadIdx.x, launch.combine_id, kSiteEntryBarrier)) {
    failed = 1;
  }
  if (peer_thread && !wait_grid_signal(launch.pad, threadIdx.x, launch.combine_id, kSiteMiddleBarrier)) failed = 1;
  __syncthreads();
  if (failed) return;
  // The block has read what the last block rewrites (combine_plan[2], pad.expected): it counts in now, and
  // checks after its sums (which overlap the atomic's round trip) whether it was last.
  unsigned int counted_before = 0;
  if (threadIdx.x == 0) counted_before = atomicAdd(launch.blocks_done, 1u);
  constexpr int kVector = kernels::Vector<T>::kCount;
  const bool vectors = row_bytes % kernels::kVectorBytes == 0 && reinterpret_cast<uintptr_t>(launch.y) % kernels::kVectorBytes == 0 &&
                       reinterpret_cast<uintptr_t>(launch.out) % kernels::kVectorBytes == 0;
  if (vectors) {
    sum_tokens<T, kVector>(launch, numbers, units, parts);
  } else {
    sum_tokens<T, 1>(launch, numbers, units, parts);
  }
  if (threadIdx.x == 0 && counted_before == gridDim.x - 1) {
    *launch.blocks_done = 0;
    for (int peer = 0; peer < W; ++peer) {
      if (peer != me) advance_grid_wait(launch.pad, peer);
    }
    launch.combine_plan[2] = 0;
  }
}

}  // namespace

void launch_rank_dispatch(const MoeLaunch& launch, DataType index_type, cudaStream_t stream) {
  // Fixed rows: kernels without the numbering's instruction-cache lines.
  auto kernel = index_type == DataType::kInt64 ? (launch.fixed_rows ? moe_rank_dispatch<int64_t, true> : moe_rank_dispatch<int64_t, false>)
                                               : (launch.fixed_rows ? moe_rank_dispatch<int32_t, true> : moe_rank_dispatch<int32_t, false>);
  kernels::launch_dependent(kernel, launch.blocks, kMoeThreads, stream, launch);
}

void launch_rank_combine(const MoeLaunch& launch, DataType type, cudaStream_t stream) {
  kernels::dispatch_type(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half> || std::is_same_v<T, float>) {
      kernels::launch_dependent(moe_rank_combine<T>, launch.blocks, kMoeThreads, stream, launch);
    } else {
      raise(ErrorCode::kInternal, "MoE combine reached with datatype {}", datatype_name(type));
    }
  });
}

}  // namespace braid::kernels::moe

BRAID_KERNEL_MODULE()

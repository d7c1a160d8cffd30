// MoE dispatch and combine in the rank-major layout (MoeLayout::kRankMajor), one launch each on the caller's
// stream. A token goes once to each rank holding one of its experts, into row source * max_tokens + i there, i
// its place among the tokens the source sends that rank (in token order). The source numbers its tokens itself,
// so no count exchange comes before the first store. With fixed rows (MoeShape::low_latency) i is the token's
// index: nothing is numbered, every block stores at once, and the rows of tokens a rank does not receive carry
// metadata that says so (source rank and token -1, no local expert).
//   dispatch (launch.blocks blocks): block b takes tokens [b * c, (b + 1) * c) of this rank, c = ceil(T / blocks).
//     It counts the tokens before them that go to each rank (one pass over tokens [0, its end), a ballot per rank)
//     to number its own, then stores each token's row and metadata (the token's local experts and weights on
//     that rank, its index) into every rank it goes to, this one included (a row is read once for all of them),
//     adds its pairs per expert into the receivers' expert_pairs, records the rows it wrote there (block_rows,
//     which combine reads) and signals block b of every peer. Block 0 then waits for every block of every peer
//     and moves the expert counts out.
//   combine (launch.blocks blocks): unless y is combine_input, block b copies the rows of y that block b of each
//     peer will read (those that peer's block b wrote in the dispatch) into combine_input. Once every row the
//     peers read is in, one block signals every peer once (kGridChannel), and every block waits for every
//     peer's signal. Then block b sums, for each of its own tokens, the row of every rank the token went to (its
//     own from y, a peer's from the peer's combine_input over NVLink) and writes out; with fewer tokens than
//     blocks, a block sums a part of a token's row (parts_per_token).
// Ordering between calls: a peer writes this rank's rows only in a dispatch, which follows its last combine
// (which waited for this rank's signal, given after its own use of the rows) or, after a dispatch, an entry
// barrier. A peer rewrites its combine_input in a combine only after its next dispatch, which waits for this
// rank's blocks (so this rank's reads of the last combine are over), or after a barrier when two combines follow
// each other. The caller's own writes into combine_input come before the combine, so no barrier of the combine can
// cover them: they belong between a dispatch and the combine after it (moe.hpp), and the host refuses the one
// call that would read such a write made after a combine (moe_buffer.cpp, MoeBuffer::combine).
//
// NOTE [expert_pairs scope]
// A rank's expert_pairs words take adds from its own blocks and from every peer's at once. PTX makes atomics on
// one location atomic with each other only when each one's scope includes the other's thread; a peer's thread is
// on another GPU, outside .gpu scope, so every access to these words (the adds, and block 0's read-and-clear) is
// a system-scope atomic, the rank's own included.
#include "braid/moe.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "core/kernel_modules.hpp"
#include "moe/moe_kernels.hpp"
#include "moe/moe_layout.cuh"
#include "moe/moe_warp.cuh"
#include "sync/device_sync.hpp"

namespace braid::moe {
namespace {

using kernels::group_copy_to;

// Parts combine cuts each of `tokens` rows into, so that every block has one when there are fewer tokens than
// blocks (a block's warps then each have fewer loads to wait for one after the other): the largest power of two
// up to kMoeWarps with tokens * parts <= blocks, at least 1. Block b takes parts (units)
// piece_of<1>(tokens * parts, b, blocks); unit u is part u % parts of token u / parts. (Dispatch keeps whole
// tokens per block: a part would make every block number its tokens, and the numbering is what the first store
// waits for.)
__device__ __forceinline__ int parts_per_token(size_t tokens, int blocks) {
  int parts = 1;
  while (parts < kMoeWarps && tokens * size_t(parts) * 2 <= size_t(blocks)) parts *= 2;
  return parts;
}

// What a warp moves or sums of a row of `length` (bytes or elements, in whole Units): slice `slice` of `slices`
// of part `part` of `parts`.
template <size_t Unit>
__device__ __forceinline__ Span slice_of_part(size_t length, int part, int parts, int slice, int slices) {
  const Span whole = piece_of<Unit>(length, part, parts);
  const Span piece = piece_of<Unit>(whole.end - whole.begin, slice, slices);
  return {whole.begin + piece.begin, whole.begin + piece.end};
}

// A block's tokens' numbers (each token's ranks, as bits, and its place on each of them), in shared memory for
// up to kBlockTokens tokens from `first`: dispatch keeps those it computed, and combine loads them while it
// waits for the peers' signal, so neither waits for a load from global memory to learn where a row is.
constexpr int kBlockTokens = 32;
struct TokenNumbers {
  uint32_t ranks[kBlockTokens];
  int32_t places[kMaxWorld][kBlockTokens];
};

// Where token t's numbers are read: `shared` when it holds them, else the buffer's token_ranks and token_row.
// With fixed rows a token's place is its index, and only its ranks are kept.
struct Numbers {
  const TokenNumbers* shared;  // null: global memory
  size_t first;                // shared holds tokens [first, first + kBlockTokens)
  bool fixed;                  // launch.fixed_rows

  __device__ __forceinline__ uint32_t ranks(const MoeLaunch& launch, size_t t) const {
    return shared != nullptr ? shared->ranks[t - first] : launch.token_ranks[t];
  }
  // Row of token t in rank r's region for this rank.
  __device__ __forceinline__ int64_t row(const MoeLaunch& launch, int r, size_t t) const {
    if (fixed) return int64_t(launch.rank) * int64_t(launch.max_tokens) + int64_t(t);
    const int32_t place = shared != nullptr ? shared->places[r][t - first] : launch.token_row[size_t(r) * launch.max_tokens + t];
    return int64_t(launch.rank) * int64_t(launch.max_tokens) + place;
  }
};

// Per warp, the addresses one item reads or writes on each rank it involves, compacted: in shared memory, since
// an array in registers indexed by a count lives on the stack.
template <typename Pointer>
using WarpAddresses = Pointer[kMoeWarps][kMaxWorld];

// One warp: into addresses[0, n) (n returned, the same on every lane), for each rank r of `ranks` in order,
// `address(r)` (lane r computes it).
template <typename Pointer, typename Address>
__device__ __forceinline__ int gather_addresses(Pointer* addresses, uint32_t ranks, int world, Address&& address) {
  const unsigned int lane = lane_id();
  const bool mine = static_cast<int>(lane) < world && ((ranks >> lane) & 1u);
  const unsigned int votes = __ballot_sync(kFullWarp, mine);
  if (mine) addresses[__popc(votes & ((1u << lane) - 1u))] = address(static_cast<int>(lane));
  __syncwarp();
  return __popc(votes);
}

// One warp: `bytes` of token t's row into the ranks of `ranks` (bits), with the token's metadata (by the warp
// with its `first` bytes) and scales (the `last` bytes, fp8 dispatch) there. `rows`: this warp's addresses.
template <typename Index, bool kFixed>
__device__ void move_token(const MoeLaunch& launch, const Numbers& numbers, size_t t, uint32_t ranks, bool first,
                           bool last, Span bytes, char** rows) {
  const int W = launch.world, K = launch.top_k, L = launch.local_experts;
  const unsigned int lane = lane_id();
  __syncwarp();  // the last item's readers of `rows` are done
  int n = gather_addresses(rows, ranks, W, [&](int r) {
    return launch.peers[r] + launch.layout.rows + numbers.row(launch, r, t) * launch.row_bytes + bytes.begin;
  });
  // With fixed rows every rank's row of the token gets metadata, "not here" on the ranks it does not go to.
  if (n == 0 && !(kFixed && first && !launch.reuse_routing)) return;
  if (n > 0) group_copy_to(rows, n, launch.x + t * launch.row_bytes + bytes.begin, bytes.end - bytes.begin, lane, 32);
  if (first && !launch.reuse_routing) {  // a redispatch leaves the metadata as it is
    const int expert = lane_expert<Index>(launch, t);
    const float weight = static_cast<int>(lane) < K ? launch.topk_weights[t * K + lane] : 0.0f;
    for (int r = 0; r < W; ++r) {
      const bool sent = (ranks >> r) & 1u;
      if (!sent && !kFixed) continue;
      char* base = launch.peers[r];
      const int64_t row = numbers.row(launch, r, t);
      if (static_cast<int>(lane) < K) {
        // A rank the token does not go to holds none of its (valid, distinct) experts.
        const bool here = expert >= r * L && expert < (r + 1) * L;
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

// Every (token, slice) of the block's range into every rank the token goes to, this one included.
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

// The entry barrier of a dispatch or combine (block b with block b of every peer, on channel b) in two halves, so
// that the work before the block's first access to peer memory runs while the signals cross: arrive_at_entry
// signals, and await_entry (or, in a combine, a wait beside the peers' rows signal) waits. Together they are
// device::barrier on the channel.
// The lanes of the block's last warp signal: a release stalls the warp that issues it.
__device__ __forceinline__ int entry_peer(const device::SignalPad& pad) {
  const int peer = static_cast<int>(threadIdx.x) - static_cast<int>(blockDim.x) + 32;
  return peer >= 0 && peer < pad.world && peer != pad.rank ? peer : -1;
}

// What the entry barrier promises the peers (this rank is done with what they will overwrite) holds at the
// kernel's start: the kernels before it are complete (start_dependent_kernel).
__device__ __forceinline__ void arrive_at_entry(const device::SignalPad& pad) {
  const int peer = entry_peer(pad);
  if (peer >= 0) device::signal(pad, blockIdx.x, peer);
}

// Every thread of the block calls it; false (on every thread) when a wait failed, recorded for the host.
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

// A token's pairs (decoded ids, -1 past K) into the block's count per expert, but those repeating an id (bits of
// `repeats`), which are refused.
__device__ __forceinline__ void add_pairs(uint32_t* block_pairs, const int32_t (&ids)[kMaxTopK], uint32_t repeats) {
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) {
    if (ids[k] >= 0 && ((repeats >> k) & 1u) == 0) atomicAdd(&block_pairs[ids[k]], 1u);
  }
}

template <typename Index, bool kFixed>
__global__ void __launch_bounds__(kMoeThreads, kMoeBlocksPerSm) moe_rank_dispatch(MoeLaunch launch) {
  __shared__ uint32_t block_pairs[kMaxExperts];           // this block's pairs per expert
  __shared__ uint32_t warp_votes[kMoeWarps][kMaxWorld];  // per warp and destination: lanes whose token goes there
  __shared__ int64_t before[kMaxWorld];                   // tokens of earlier chunks per destination
  __shared__ int64_t in_range[kMaxWorld];                 // this block's tokens per destination
  kernels::start_dependent_kernel();  // the last call on the buffer (combine_plan, token_row)
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int me = launch.rank, W = launch.world, L = launch.local_experts;
  bool entry_barrier = false;  // this launch's blocks wait on their channels at an entry barrier
  if (launch.phase != kReceivingHalf) {
    entry_barrier = send_rows<Index, kFixed>(launch, block_pairs, warp_votes, before, in_range);
    // This rank's own pairs are added by its blocks, not behind a peer's signal: each block counts itself in.
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(launch.blocks_done, 1u);
    }
  }
  // Block 0 waits for every block of every peer, a thread per (channel, peer), and for every block of this rank;
  // the other blocks end after their sends. Then every row, pair count and record of this dispatch is here, and
  // the kernel's end tells the next kernel so.
  if (launch.phase == kSendingHalf || blockIdx.x != 0) return;
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  // Thread 0 waits for this rank's blocks, and the threads past the first warp wait for the peers' meanwhile. Not
  // after an entry barrier: block b waited on channel b there, and one thread waits per channel and peer at a
  // time, so block 0 takes the channels only once every block has counted itself in (after its wait).
  // Every block counts itself in whatever its sends did, but one that is never scheduled (the GPU held by other
  // work) would hold this wait forever: it is bounded like a wait for a peer, and names this rank as the peer.
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

// Dispatch's sending half, by every block: the entry barrier when it follows a dispatch (signalled before the
// numbering, awaited after it), the numbering, the rows into every rank they go to and the signal. Returns whether
// it passed an entry barrier, early (the receiving half's wait then gives up too) when the barrier failed. A
// redispatch (reuse_routing) takes T and the numbering of the last dispatch and moves the rows (and scales) only.
template <typename Index, bool kFixed>
__device__ bool send_rows(const MoeLaunch& launch, uint32_t* block_pairs, uint32_t (*warp_votes)[kMaxWorld],
                          int64_t* before, int64_t* in_range) {
  const int me = launch.rank, W = launch.world, K = launch.top_k;
  // The last call on the buffer was a dispatch: peers may still read the rows this one overwrites. After a
  // combine that is implied (its barrier came after every rank's use of the rows).
  const bool after_dispatch = launch.combine_plan[2] != 0;
  const bool reuse = launch.reuse_routing;
  const size_t tokens = reuse ? static_cast<size_t>(*launch.tokens) : call_tokens(launch);
  const Span range = piece_of<1>(tokens, blockIdx.x, gridDim.x);
  // The numbers the moves read: this block's own, kept in shared memory, unless a redispatch numbers nothing or
  // the block has more tokens than that holds.
  __shared__ TokenNumbers numbered;
  const Numbers numbers{!reuse && range.end - range.begin <= kBlockTokens ? &numbered : nullptr, range.begin,
                        kFixed};
  // The block holding the last token scans every token: it reports refused ids (once) and the totals.
  const bool reporter = tokens > 0 ? range.begin < range.end && range.end == tokens : blockIdx.x == 0;
  for (int e = threadIdx.x; e < launch.experts; e += blockDim.x) block_pairs[e] = 0;
  if (threadIdx.x < kMaxWorld) before[threadIdx.x] = in_range[threadIdx.x] = 0;
  if (!reuse && blockIdx.x == 0 && threadIdx.x == 0) *launch.tokens = static_cast<int64_t>(tokens);  // for combine
  __syncthreads();
  if (after_dispatch) arrive_at_entry(launch.pad);  // awaited before the first store into a peer

  // Number this block's tokens per destination: a thread per token, a ballot per destination and warp. A block
  // with no tokens numbers nothing, and a warp past the block's last token only clears its votes (the pass is
  // issue-bound when T is small: every block scans the tokens before its own).
  const ExpertRanks expert_ranks(launch.local_experts);
  const unsigned int warp = threadIdx.x / 32, lane = lane_id();
  const bool numbering = !reuse && range.begin < range.end && !kFixed;
  if (kFixed && !reuse) {
    // Fixed rows: a thread per token of the block finds its ranks and pairs; no token before the block's is read.
    // Every block reports its own tokens' refused ids (the communicator keeps the first report).
    for (size_t t = range.begin + threadIdx.x; t < range.end; t += blockDim.x) {
      int32_t ids[kMaxTopK];
      decode_expert_ids(launch, [&](int k) -> int64_t { return k < K ? expert_of<Index>(launch, t, k) : -1; }, true, ids);
      const uint32_t ranks = expert_ranks.ranks_of(ids);
      launch.token_ranks[t] = ranks;
      if (numbers.shared != nullptr) numbered.ranks[t - range.begin] = ranks;
      add_pairs(block_pairs, ids, repeated_ids(launch, ids, t, true));
    }
    // The block's rows on every rank are its tokens' (holes included), for combine's copies and received.
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
      // Repeats stay: a token's ranks are the same without them.
      decode_expert_ids(launch, [&](int k) -> int64_t { return k < K && t < range.end ? expert_of<Index>(launch, t, k) : -1; },
                        reporter, ids);
      const uint32_t ranks = expert_ranks.ranks_of(ids);
      // Loops over the ranks stay rolled: unrolled to kMaxWorld, the iterations past W would be jumped over,
      // each to another instruction-cache line (microseconds a call in all).
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
        int64_t row = before[r] + __popc(warp_votes[warp][r] & ((1u << lane) - 1u));  // the lanes below this one
        for (unsigned int w = 0; w < warp; ++w) row += __popc(warp_votes[w][r]);
        launch.token_row[size_t(r) * launch.max_tokens + t] = static_cast<int32_t>(row);
        if (numbers.shared != nullptr) numbered.places[r][t - range.begin] = static_cast<int32_t>(row);
        atomicAdd(reinterpret_cast<unsigned long long*>(&in_range[r]), 1ull);
      }
      // A pair repeating an id of its token is refused (reported by this block, its token's owner).
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

  // Rows and metadata into every rank they go to, this one included (a row read once is stored to all of them);
  // the pairs per expert and the rows this block wrote (and, by the reporter, the totals) into the peers; then
  // the signal, whose release covers them all. The numbering touched no peer's memory, so the entry barrier's
  // signals crossed meanwhile.
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

// Sources' vectors loaded together (one memory latency for up to this many ranks, not one each).
constexpr int kSourceBatch = 4;

// One warp: out[h] = the float32 sum over sources[0, n) of source[h], for h in `elements`; whole 16-byte vectors
// of N when every row allows it, else one element at a time.
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

// The block's `units` (parts_per_token), each summed by one or more warps (slices).
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

// kGridChannel's signal from `peer`, waited for by one thread of every block: the count after the one the last
// such wait reached (pad.expected, which these waits read and leave; advance_grid_wait moves it on once every
// block has waited).
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
  kernels::start_dependent_kernel();  // the kernels that wrote y
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int me = launch.rank, W = launch.world;
  const bool peer_thread = threadIdx.x < static_cast<unsigned>(W) && static_cast<int>(threadIdx.x) != me;
  const size_t row_bytes = launch.hidden * sizeof(T);
  // y is combine_input: the rows the peers read were written by earlier kernels (complete: start_dependent_kernel),
  // so block 0 tells the peers first, before any load of this call's state that the release would wait for.
  if (launch.phase != kReceivingHalf && !launch.copy_y && blockIdx.x == 0 && peer_thread) {
    device::signal(launch.pad, kGridChannel, threadIdx.x);
  }
  const bool after_combine = launch.phase != kReceivingHalf && launch.combine_plan[2] == 0;
  if (launch.phase != kReceivingHalf) {
    // Two combines in a row: peers may still read the rows of combine_input this one rewrites. A combine that
    // rewrites none (y is combine_input) awaits the barrier with the peers' rows signal, below.
    if (after_combine) arrive_at_entry(launch.pad);
    if (after_combine && launch.copy_y && !await_entry(launch.pad, launch.combine_id)) return;
    if (launch.copy_y) {
      char* base = launch.peers[me];
      for (int s = 0; s < W; ++s) {
        if (s == me) continue;  // this rank reads its own tokens' rows from y
        const uint64_t word = at_offset<const uint64_t>(base, launch.layout.block_rows)[size_t(s) * launch.blocks + blockIdx.x];
        const size_t first = size_t(s) * launch.max_tokens + (word >> 32), count = word & 0xffffffffu;
        kernels::block_copy(base + launch.layout.combine + first * row_bytes, launch.y + first * row_bytes, count * row_bytes);
      }
    }
    // The rows the peers read are all in: written by earlier kernels (block 0 signalled above), or copied by
    // every block, the last of which says so (a counter of its own: a block may reach the end of the kernel
    // before another one is done copying). One signal to each peer either way (a signal from each block would
    // cost each a system-scope release), whichever the peer's y is.
    if (launch.copy_y && last_block(launch.copies_done)) {
      if (threadIdx.x == 0) *launch.copies_done = 0;  // every block has added
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
  // The numbers of the block's tokens (the last dispatch's, in global memory) into shared memory while the
  // peers' signal is on its way.
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
  // A combine that copied nothing awaits its entry barrier here, beside the peers' rows signal.
  if (peer_thread && after_combine && !launch.copy_y &&
      !device::wait(launch.pad, blockIdx.x, threadIdx.x, launch.combine_id, kSiteEntryBarrier)) {
    failed = 1;
  }
  if (peer_thread && !wait_grid_signal(launch.pad, threadIdx.x, launch.combine_id, kSiteMiddleBarrier)) failed = 1;
  __syncthreads();
  if (failed) return;
  // The block has read what the launch's last block rewrites (combine_plan[2] and the expected grid signals):
  // it counts itself in now, and learns whether it was the last only after its sums, so that the atomic's round
  // trip overlaps them instead of ending the kernel.
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
    launch.combine_plan[2] = 0;  // a combine followed the last dispatch
  }
}

}  // namespace

void launch_rank_dispatch(const MoeLaunch& launch, DataType index_type, cudaStream_t stream) {
  // Fixed rows get kernels of their own: without the numbering's code between its decoding and its stores, a
  // decode batch's dispatch runs fewer instruction-cache lines.
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

}  // namespace braid::moe

BRAID_KERNEL_MODULE()

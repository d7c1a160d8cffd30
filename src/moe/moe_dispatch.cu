// MoE dispatch, four launches on the caller's stream (moe_buffer.cpp enqueues them):
//   1. route (experts + world blocks, local): counts this rank's pairs per expert and tokens per destination
//      rank, and numbers them in token order (pair_slot, token_slot) with block scans, so the layout is the
//      same for the same routing every time.
//   2. exchange (one block): writes this rank's counts into every rank's count matrix (parity = dispatches so
//      far, so a fast rank's next dispatch never overwrites counts a slow rank still reads), then a barrier:
//      every peer's counts are here, and every peer has entered this dispatch (its receive rows and metadata
//      from the last one are no longer in use).
//   3. scatter (kScatterBlocks blocks): every rank computes every rank's layout from the count matrix; a warp
//      per token stores the token's row once into each destination rank (its first expert there), and the
//      metadata of each of its rows there (weight, expert, source, the row holding the data) and its entry in
//      the destination's token table. Ends with a barrier per block: every peer's rows for this rank are here.
//   4. expand (local): copies the rows of a token's other experts on this rank from the row that crossed
//      NVLink, marks padding rows, writes the expert counts and offsets, and advances the dispatch count.
// A destination whose rows would exceed the capacity gets none (every sender sees the same layout) and reports
// it; expert ids outside [-1, E) are skipped and reported; T above max_tokens makes the call send nothing.
#include <cub/block/block_scan.cuh>

#include "collectives/elementwise.cuh"
#include "collectives/staged.cuh"
#include "moe/moe_kernels.hpp"
#include "moe/moe_layout.cuh"
#include "sync/device_sync.hpp"

namespace braid::moe {
namespace {

using kernels::warp_copy;

// Work items are spread over warps, not blocks: a row is a few KB, and many warps each with a row in flight keep
// NVLink and HBM busy where a block per row would wait on each row's latency in turn.
__device__ __forceinline__ size_t first_warp() { return size_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; }
__device__ __forceinline__ size_t warp_count() { return size_t(gridDim.x) * (blockDim.x / 32); }
__device__ __forceinline__ unsigned int lane() { return threadIdx.x & 31u; }

// T of this call: the device scalar when given, else the host value; above max_tokens it is refused (0).
__device__ inline size_t call_tokens(const MoeLaunch& launch) {
  int64_t tokens = launch.num_tokens_device != nullptr ? *launch.num_tokens_device : static_cast<int64_t>(launch.num_tokens);
  if (tokens < 0 || static_cast<uint64_t>(tokens) > launch.max_tokens) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      device::record_data_error(launch.pad, device::kErrorTooManyTokens, launch.dispatch_id, -1, tokens,
                                static_cast<long long>(launch.max_tokens));
    }
    tokens = 0;
  }
  return static_cast<size_t>(tokens);
}

template <typename Index>
__global__ void __launch_bounds__(kMoeThreads) moe_route(MoeLaunch launch) {
  using Scan = cub::BlockScan<int, kMoeThreads>;
  __shared__ typename Scan::TempStorage scan;
  const size_t tokens = call_tokens(launch);
  const int K = launch.top_k, L = launch.local_experts;
  const bool expert_block = blockIdx.x < static_cast<unsigned>(launch.experts);
  const int target = expert_block ? blockIdx.x : blockIdx.x - launch.experts;  // expert, or destination rank
  int64_t running = 0;
  for (size_t chunk = 0; chunk < tokens; chunk += kMoeThreads) {
    const size_t t = chunk + threadIdx.x;
    int mine = 0;
    uint32_t ranks = 0;
    if (t < tokens) {
      for (int k = 0; k < K; ++k) {
        const int64_t e = expert_of<Index>(launch, t, k);
        if (e < -1 || e >= launch.experts) {
          if (!expert_block && target == 0) {
            device::record_data_error(launch.pad, device::kErrorBadExpert, launch.dispatch_id, -1, e, launch.experts);
          }
          continue;
        }
        if (e == -1) continue;
        ranks |= 1u << (e / L);
        if (expert_block ? e == target : e / L == target) mine = expert_block ? mine + 1 : 1;
      }
    }
    int before = 0, total = 0;
    Scan(scan).ExclusiveSum(mine, before, total);
    if (t < tokens) {
      if (expert_block) {
        int n = 0;
        for (int k = 0; k < K && n < mine; ++k) {
          if (expert_of<Index>(launch, t, k) == target) launch.pair_slot[t * K + k] = static_cast<int32_t>(running + before + n++);
        }
      } else {
        launch.token_slot[t * launch.world + target] = mine ? static_cast<int32_t>(running + before) : -1;
        if (target == 0) launch.token_ranks[t] = ranks;
      }
    }
    running += total;
    __syncthreads();  // the scan's storage is reused
  }
  if (threadIdx.x == 0) {
    launch.my_counts[blockIdx.x] = running;  // experts first, then destination ranks
    if (blockIdx.x == 0) *launch.tokens = static_cast<int64_t>(tokens);
  }
}

__global__ void __launch_bounds__(kMoeThreads) moe_exchange(MoeLaunch launch) {
  const uint64_t parity = *launch.epoch & 1;
  const int entries = launch.experts + launch.world;
  for (int i = threadIdx.x; i < entries * launch.world; i += blockDim.x) {
    const int owner = i / entries, entry = i % entries;
    count_row(launch, owner, parity, launch.rank)[entry] = launch.my_counts[entry];
  }
  device::barrier(launch.pad, 0, launch.dispatch_id, kSiteEntryBarrier);
}

template <typename Index>
__global__ void __launch_bounds__(kMoeThreads) moe_scatter(MoeLaunch launch) {
  __shared__ Layout layout;
  __shared__ uint64_t parity;
  if (threadIdx.x == 0) parity = *launch.epoch & 1;
  __syncthreads();
  compute_layout(launch, parity, layout);
  const int K = launch.top_k, L = launch.local_experts, me = launch.rank;
  const size_t row_bytes = launch.hidden * launch.element_bytes;
  const size_t tokens = static_cast<size_t>(*launch.tokens);
  for (size_t t = first_warp(); t < tokens; t += warp_count()) {  // a warp per token
    for (int step = 0; step < launch.world; ++step) {
      const int r = (me + step) % launch.world;
      const int32_t slot = launch.token_slot[t * launch.world + r];
      if (slot < 0 || layout.rank_rows[r] > static_cast<int64_t>(launch.capacity)) continue;
      auto row_of = [&](int k, int64_t e) { return layout.expert_start[e] + layout.mine_before[e] + launch.pair_slot[t * K + k]; };
      int64_t primary = -1;
      for (int k = 0; k < K && primary < 0; ++k) {
        const int64_t e = expert_of<Index>(launch, t, k);
        if (e >= 0 && e < launch.experts && e / L == r) primary = row_of(k, e);
      }
      char* base = launch.peers[r];
      warp_copy(base + launch.layout.rows + primary * row_bytes, launch.x + t * row_bytes, row_bytes);
      if (lane() < K) {
        const int k = lane();
        const int64_t e = expert_of<Index>(launch, t, k);
        int32_t row = -1;
        if (e >= 0 && e < launch.experts && e / L == r) {
          row = static_cast<int32_t>(row_of(k, e));
          at_offset<float>(base, launch.layout.row_weight)[row] = launch.topk_weights[t * K + k];
          at_offset<int32_t>(base, launch.layout.row_expert)[row] = static_cast<int32_t>(e - r * L);
          at_offset<int32_t>(base, launch.layout.row_rank)[row] = me;
          at_offset<int32_t>(base, launch.layout.row_token)[row] = static_cast<int32_t>(t);
          at_offset<int32_t>(base, launch.layout.row_primary)[row] = static_cast<int32_t>(primary);
        }
        at_offset<int32_t>(base, launch.layout.table_rows)[(me * launch.max_tokens + slot) * K + k] = row;
      }
      if (lane() == 0) at_offset<int32_t>(base, launch.layout.table_token)[me * launch.max_tokens + slot] = static_cast<int32_t>(t);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    uint32_t delivered = 0;
    for (int r = 0; r < launch.world; ++r) {
      if (layout.rank_rows[r] <= static_cast<int64_t>(launch.capacity)) delivered |= 1u << r;
    }
    *launch.delivered_ranks = delivered;
  }
  device::barrier(launch.pad, blockIdx.x, launch.dispatch_id, kSiteExitBarrier);
}

__global__ void __launch_bounds__(kMoeThreads) moe_expand(MoeLaunch launch) {
  __shared__ Layout layout;
  __shared__ uint64_t parity;
  if (threadIdx.x == 0) parity = *launch.epoch & 1;
  __syncthreads();
  compute_layout(launch, parity, layout);
  const int me = launch.rank, L = launch.local_experts, first = me * L;
  const int64_t used = layout.rank_rows[me];
  const bool overflow = used > static_cast<int64_t>(launch.capacity);
  if (blockIdx.x == 0) {
    const int64_t* counts = count_matrix(launch, parity);
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
      launch.expert_counts[j] = layout.expert_rows[first + j];
      launch.expert_offsets[j] = layout.expert_start[first + j];
    }
    if (threadIdx.x == 0) launch.expert_offsets[L] = used;
    if (threadIdx.x < launch.world) {
      const int s = threadIdx.x;
      launch.received_tokens[s] = overflow ? 0 : counts[s * (launch.experts + launch.world) + launch.experts + me];
    }
    if (overflow && threadIdx.x == 0) {
      device::record_data_error(launch.pad, device::kErrorOverflow, launch.dispatch_id, -1, used,
                                static_cast<long long>(launch.capacity));
    }
  }
  if (!overflow) {
    char* base = launch.peers[me];
    const size_t row_bytes = launch.hidden * launch.element_bytes;
    int32_t* primary = at_offset<int32_t>(base, launch.layout.row_primary);
    for (int64_t row = first_warp(); row < used; row += warp_count()) {  // a warp per row
      int j = 0;  // the expert block holding the row: the last one starting at or before it
      for (int lo = 0, hi = L - 1; lo <= hi;) {
        const int mid = (lo + hi) / 2;
        if (layout.expert_start[first + mid] <= row) { j = mid; lo = mid + 1; } else { hi = mid - 1; }
      }
      if (row >= layout.expert_start[first + j] + layout.expert_rows[first + j]) {  // alignment padding
        if (lane() == 0) {
          at_offset<float>(base, launch.layout.row_weight)[row] = 0.0f;
          at_offset<int32_t>(base, launch.layout.row_expert)[row] = -1;
          at_offset<int32_t>(base, launch.layout.row_rank)[row] = -1;
          at_offset<int32_t>(base, launch.layout.row_token)[row] = -1;
          primary[row] = -1;
        }
        continue;
      }
      const int32_t source = primary[row];
      if (source != row) warp_copy(base + launch.layout.rows + row * row_bytes, base + launch.layout.rows + source * row_bytes, row_bytes);
    }
  }
  kernels::advance_after_last_block(launch.epoch, launch.blocks_done);
}

}  // namespace

void launch_dispatch(const MoeLaunch& launch, DataType index_type, cudaStream_t stream) {
  const bool wide = index_type == DataType::kInt64;
  const int route_blocks = launch.experts + launch.world;
  if (wide) moe_route<int64_t><<<route_blocks, kMoeThreads, 0, stream>>>(launch);
  else moe_route<int32_t><<<route_blocks, kMoeThreads, 0, stream>>>(launch);
  moe_exchange<<<1, kMoeThreads, 0, stream>>>(launch);
  if (wide) moe_scatter<int64_t><<<kScatterBlocks, kMoeThreads, 0, stream>>>(launch);
  else moe_scatter<int32_t><<<kScatterBlocks, kMoeThreads, 0, stream>>>(launch);
  moe_expand<<<kExpandBlocks, kMoeThreads, 0, stream>>>(launch);
}

}  // namespace braid::moe

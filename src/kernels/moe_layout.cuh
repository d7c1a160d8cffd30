// Device code shared by the MoE kernels: T, the expert ids, and the expert-major receive layout every rank computes
// alike from the count matrix.
#pragma once

#include <cuda_runtime.h>

#include "kernels/moe_launch.hpp"

namespace braid::kernels::moe {

__device__ __forceinline__ size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Out of line, off the hot paths' instruction-cache lines; by value (a launch reference copies it to the stack).
__device__ __noinline__ inline void record_refused(device::ErrorWord* word, int rank, unsigned int collective,
                                                   unsigned int code, long long value, long long limit) {
  device::SignalPad pad{};
  pad.data_error = word;
  pad.rank = rank;
  device::record_data_error(pad, code, collective, -1, value, limit);
}

__device__ __forceinline__ void report_data_error(const MoeLaunch& launch, unsigned int code, long long value,
                                                  long long limit) {
  record_refused(launch.pad.data_error, launch.pad.rank, launch.dispatch_id, code, value, limit);
}

// T of this call (the device scalar when given); above max_tokens it is refused as 0.
__device__ inline size_t call_tokens(const MoeLaunch& launch) {
  int64_t tokens = launch.num_tokens_device != nullptr ? *launch.num_tokens_device : static_cast<int64_t>(launch.num_tokens);
  if (tokens < 0 || static_cast<uint64_t>(tokens) > launch.max_tokens) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      report_data_error(launch, device::kErrorTooManyTokens, tokens, static_cast<long long>(launch.max_tokens));
    }
    tokens = 0;
  }
  return static_cast<size_t>(tokens);
}

// Piece `piece` of `pieces` of `total`, in whole Units; empty past the end.
struct Span {
  size_t begin, end;
};
template <size_t Unit>
__device__ __forceinline__ Span piece_of(size_t total, int piece, int pieces) {
  const size_t length = ((total + pieces - 1) / pieces + Unit - 1) / Unit * Unit;
  const size_t begin = min(total, size_t(piece) * length);
  return {begin, min(total, begin + length)};
}

// Rows rounded up to the expert alignment; a 64-bit division (long on the GPU) only for a non-power of two.
__device__ __forceinline__ int64_t align_rows(int64_t rows, int alignment) {
  if ((alignment & (alignment - 1)) == 0) return (rows + alignment - 1) & ~static_cast<int64_t>(alignment - 1);
  return static_cast<int64_t>(align_up(static_cast<size_t>(rows), static_cast<size_t>(alignment)));
}

// A count word: the count in the low 48 bits, (dispatches so far + 1) mod 2^16 in the high 16, one store. Its tag
// says it is this dispatch's (two before, same parity, has another), so no fence or flag follows it.
constexpr uint64_t kCountMask = (uint64_t(1) << 48) - 1;
__device__ __forceinline__ uint64_t count_tag_of(uint64_t epoch) { return ((epoch + 1) & 0xffffu) << 48; }
__device__ __forceinline__ int64_t count_value(uint64_t word) { return static_cast<int64_t>(word & kCountMask); }

// This rank's count matrix for `parity`: [world][experts + world] tagged counts.
__device__ __forceinline__ const uint64_t* count_matrix(const MoeLaunch& launch, uint64_t parity) {
  const char* base = launch.peers[launch.rank] + launch.layout.counts;
  return reinterpret_cast<const uint64_t*>(base) + parity * launch.world * (launch.experts + launch.world);
}

__device__ __forceinline__ uint64_t* count_row(const MoeLaunch& launch, int owner, uint64_t parity, int source) {
  char* base = launch.peers[owner] + launch.layout.counts;
  return reinterpret_cast<uint64_t*>(base) + (parity * launch.world + source) * (launch.experts + launch.world);
}

// The rank of expert e < kMaxExperts by a multiplication, not a division. Exact: e * magic / 2^32 exceeds e / L by
// less than e / 2^32 < 1 / L.
struct ExpertRanks {
  uint64_t magic;
  __device__ explicit ExpertRanks(int local_experts)
      : magic(uint64_t(0xffffffffu / static_cast<uint32_t>(local_experts)) + 1) {}  // ceil(2^32 / L), 32-bit division
  __device__ __forceinline__ int of(int expert) const { return static_cast<int>((uint64_t(expert) * magic) >> 32); }
  __device__ __forceinline__ uint32_t ranks_of(const int32_t (&ids)[kMaxTopK]) const {
    uint32_t ranks = 0;
#pragma unroll
    for (int k = 0; k < kMaxTopK; ++k) {
      if (ids[k] >= 0) ranks |= 1u << of(ids[k]);
    }
    return ranks;
  }
};

// Expert id of pair (t, k); -1: no expert.
template <typename Index>
__device__ __forceinline__ int64_t expert_of(const MoeLaunch& launch, size_t t, int k) {
  return static_cast<int64_t>(static_cast<const Index*>(launch.topk_idx)[t * launch.top_k + k]);
}

// Ids `id(k)` (-1 past K), those outside [-1, E) made -1 and reported by `reporter`; repeats stay. One report
// after the loop: inside the unrolled loop it costs an instruction-cache miss per id.
template <typename Id>
__device__ __forceinline__ void decode_expert_ids(const MoeLaunch& launch, Id&& id, bool reporter, int32_t (&ids)[kMaxTopK]) {
  int64_t loaded[kMaxTopK];
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) loaded[k] = id(k);
  bool refused = false;
  int64_t first_refused = 0;
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) {
    const int64_t e = loaded[k];
    const bool bad = e < -1 || e >= launch.experts;
    first_refused = bad && !refused ? e : first_refused;
    refused = refused || bad;
    ids[k] = bad ? -1 : static_cast<int32_t>(e);
  }
  if (refused && reporter) report_data_error(launch, device::kErrorBadExpert, first_refused, launch.experts);
}

// Bits k of the pairs repeating an expert of a smaller k; the first reported with `report`. Straight-line: a
// branch per k would jump to another instruction-cache line.
__device__ __forceinline__ uint32_t repeated_ids(const MoeLaunch& launch, const int32_t (&ids)[kMaxTopK], size_t t,
                                                 bool report) {
  uint32_t repeats = 0;
#pragma unroll
  for (int k = 1; k < kMaxTopK; ++k) {
#pragma unroll
    for (int j = 0; j < k; ++j) repeats |= ids[k] >= 0 && ids[j] == ids[k] ? 1u << k : 0u;
  }
  if (report && repeats != 0) {
    const int k = __ffs(repeats) - 1;
    long long id = 0;
#pragma unroll
    for (int i = 0; i < kMaxTopK; ++i) id = i == k ? ids[i] : id;  // ids stays in registers: constant indices
    report_data_error(launch, device::kErrorRepeatedExpert, id, static_cast<long long>(t));
  }
  return repeats;
}

// Where each expert's rows start, and this rank's pairs in them.
struct Layout {
  int64_t expert_start[kMaxExperts];  // row of expert e's block on its rank
  int64_t mine_before[kMaxExperts];   // rows of it that earlier source ranks fill
  int64_t expert_rows[kMaxExperts];   // all sources
  int64_t rank_rows[kMaxWorld];       // rows rank r needs, padding included
};

// Every thread calls it once every count word carries this dispatch's tag. `alongside()` runs beside the scans
// (warps 0 to world - 1).
template <typename Alongside>
__device__ inline void compute_layout(const MoeLaunch& launch, uint64_t parity, Layout& layout, Alongside&& alongside) {
  const uint64_t* counts = count_matrix(launch, parity);
  const int stride = launch.experts + launch.world;
  for (int e = threadIdx.x; e < launch.experts; e += blockDim.x) {
    int64_t count[kMaxWorld];  // loaded together
#pragma unroll
    for (int s = 0; s < kMaxWorld; ++s) count[s] = s < launch.world ? count_value(counts[s * stride + e]) : 0;
    int64_t total = 0, before = 0;
#pragma unroll
    for (int s = 0; s < kMaxWorld; ++s) {
      total += count[s];
      if (s < launch.rank) before += count[s];
    }
    layout.expert_rows[e] = total;
    layout.mine_before[e] = before;
  }
  __syncthreads();
  alongside();
  // A warp per rank: exclusive scan of its experts' aligned sizes, 32 a step.
  const unsigned int lane = threadIdx.x % 32;
  for (int r = static_cast<int>(threadIdx.x / 32); r < launch.world; r += static_cast<int>(blockDim.x / 32)) {
    int64_t offset = 0;
    for (int j0 = 0; j0 < launch.local_experts; j0 += 32) {
      const int e = r * launch.local_experts + j0 + static_cast<int>(lane);
      const bool mine = j0 + static_cast<int>(lane) < launch.local_experts;
      const int64_t size = mine ? align_rows(layout.expert_rows[e], launch.alignment) : 0;
      int64_t inclusive = size;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int64_t below = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= static_cast<unsigned>(d)) inclusive += below;
      }
      if (mine) layout.expert_start[e] = offset + inclusive - size;
      offset += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) layout.rank_rows[r] = offset;
  }
  __syncthreads();
}

}  // namespace braid::kernels::moe

// Device side shared by the MoE kernels: reading T and the expert ids, and the receive layout every rank
// computes alike from the count matrix (so senders know where their rows go without asking the receiver).
#pragma once

#include <cuda_runtime.h>

#include "moe/moe_launch.hpp"

namespace braid::moe {

__device__ __forceinline__ size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// This rank's count matrix for `parity`: [world][experts + world], in its own symmetric memory.
__device__ __forceinline__ const int64_t* count_matrix(const MoeLaunch& launch, uint64_t parity) {
  const char* base = launch.peers[launch.rank] + launch.layout.counts;
  return reinterpret_cast<const int64_t*>(base) + parity * launch.world * (launch.experts + launch.world);
}

__device__ __forceinline__ int64_t* count_row(const MoeLaunch& launch, int owner, uint64_t parity, int source) {
  char* base = launch.peers[owner] + launch.layout.counts;
  return reinterpret_cast<int64_t*>(base) + (parity * launch.world + source) * (launch.experts + launch.world);
}

// Expert id of pair (t, k), widened; -1 for "no expert".
template <typename Index>
__device__ __forceinline__ int64_t expert_of(const MoeLaunch& launch, size_t t, int k) {
  return static_cast<int64_t>(static_cast<const Index*>(launch.topk_idx)[t * launch.top_k + k]);
}

// Where every expert's rows start on its rank, where this rank's pairs start inside each block, and how many
// rows (padding included) every rank needs. Every thread of the block calls it; results in shared memory.
struct Layout {
  int64_t expert_start[kMaxExperts];  // row of expert e's block on its rank
  int64_t mine_before[kMaxExperts];   // rows of expert e's block that earlier source ranks fill
  int64_t expert_rows[kMaxExperts];   // rows of expert e (all sources)
  int64_t rank_rows[kMaxWorld];       // rows rank r needs, padding included
};

__device__ inline void compute_layout(const MoeLaunch& launch, uint64_t parity, Layout& layout) {
  const int64_t* counts = count_matrix(launch, parity);
  const int stride = launch.experts + launch.world;
  for (int e = threadIdx.x; e < launch.experts; e += blockDim.x) {
    int64_t total = 0, before = 0;
    for (int s = 0; s < launch.world; ++s) {
      const int64_t c = counts[s * stride + e];
      total += c;
      if (s < launch.rank) before += c;
    }
    layout.expert_rows[e] = total;
    layout.mine_before[e] = before;
  }
  __syncthreads();
  if (threadIdx.x < launch.world) {
    const int r = threadIdx.x;
    int64_t offset = 0;
    for (int j = 0; j < launch.local_experts; ++j) {
      const int e = r * launch.local_experts + j;
      layout.expert_start[e] = offset;
      offset = static_cast<int64_t>(align_up(static_cast<size_t>(offset + layout.expert_rows[e]), launch.alignment));
    }
    layout.rank_rows[r] = offset;
  }
  __syncthreads();
}

}  // namespace braid::moe

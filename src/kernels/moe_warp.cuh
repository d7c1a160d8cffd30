// Warp and block helpers of the rank-major MoE kernels (moe_rank_major.cu, moe_lines.cu).
#pragma once

#include <cuda_runtime.h>

#include "kernels/moe_launch.hpp"
#include "kernels/moe_layout.cuh"

namespace braid::kernels::moe {

constexpr unsigned int kFullWarp = 0xffffffffu;

__device__ __forceinline__ unsigned int lane_id() { return threadIdx.x & 31u; }

// Slices a token's row is cut into, a warp each: a power of two keeping every warp busy.
__device__ __forceinline__ int slices_for(size_t tokens_here) {
  int slices = 1;
  while (slices < kMoeWarps && size_t(slices) * 2 * tokens_here <= size_t(kMoeWarps)) slices *= 2;
  return slices;
}

// Lane k's expert of token t; -1 past top_k, for an id outside [-1, E) and for a repeat of an id at a smaller k
// (reported where the ids are decoded). Every lane calls it.
template <typename Index>
__device__ __forceinline__ int lane_expert(const MoeLaunch& launch, size_t t) {
  const int k = static_cast<int>(lane_id());
  int64_t id = k < launch.top_k ? expert_of<Index>(launch, t, k) : -1;
  if (id < -1 || id >= launch.experts) id = -1;
  const int expert = static_cast<int>(id);
  bool repeated = false;
  for (int j = 0; j < launch.top_k; ++j) {
    const int other = __shfl_sync(kFullWarp, expert, j);
    repeated |= j < k && other == expert && expert >= 0;
  }
  return repeated ? -1 : expert;
}

// Called by every block once done: true in the last one, which then sees every other block's writes.
__device__ __forceinline__ bool last_block(unsigned int* blocks_done) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

}  // namespace braid::kernels::moe

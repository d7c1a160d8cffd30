// Device side of braid-bench --moe: the token rows every rank makes, and the kernels of the NCCL baseline
// ("what frameworks do today"): route tokens per destination rank, gather rows per destination, and the
// weighted sum of what comes back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"

#ifdef __CUDACC__
#define BRAID_MOE_HD __host__ __device__
#else
#define BRAID_MOE_HD
#endif

namespace braid::bench::moe {

// Element `index` of rank `rank`'s token rows ([T, H] row-major, index = t * H + h) is k / 128 with k in
// ±[1, 127]: exact in bfloat16, float16 and float32, never zero. Host and device agree on it.
BRAID_MOE_HD inline int token_value_k(uint64_t seed, int rank, uint64_t index) {
  uint64_t z = seed ^ (static_cast<uint64_t>(rank + 1) * 0xD1B54A32D192ED03ull) ^ (index * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const int magnitude = 1 + static_cast<int>(z % 127);
  return (z >> 63) != 0 ? -magnitude : magnitude;
}

// Writes rank `rank`'s token rows [tokens, hidden] of `type` (kBFloat16, kFloat16, kFloat32) into x.
cudaError_t fill_tokens(DataType type, void* x, size_t tokens, size_t hidden, uint64_t seed, int rank,
                        cudaStream_t stream);

// The routing of the baseline, from ids [tokens, top_k] (int64; ids outside [0, experts) are skipped) and weights
// [tokens, top_k]: for every destination rank d (which holds experts [d * L, (d + 1) * L), L = experts / world),
// lists[d * tokens + i] = the i-th token (in token order) with at least one expert on d, and send_counts[d] = how
// many; slots[t * world + d] = t's position in d's list or -1; weight_sums[t * world + d] = the sum of t's weights
// of experts on d. world <= 64.
cudaError_t route_tokens(const int64_t* ids, const float* weights, size_t tokens, int top_k, int experts, int world,
                         int32_t* lists, int32_t* slots, float* weight_sums, int64_t* send_counts, cudaStream_t stream);

// Packs the rows per destination: send[prefix(d) + i] = x[lists[d * tokens + i]] for i < send_counts[d], prefix(d) =
// the sum of send_counts[0..d) (read on the device).
cudaError_t gather_rows(DataType type, const void* x, size_t hidden, size_t tokens, int world, const int32_t* lists,
                        const int64_t* send_counts, void* send, cudaStream_t stream);

// out[t] = sum over d with slots[t * world + d] >= 0 of weight_sums[t * world + d] * back[prefix(d) + slot], in
// float32, rounded once to `type`; zeros for a token sent nowhere. back is laid out as gather_rows's send.
cudaError_t weighted_sum(DataType type, const void* back, size_t hidden, size_t tokens, int world, const int32_t* slots,
                         const float* weight_sums, const int64_t* send_counts, void* out, cudaStream_t stream);

}  // namespace braid::bench::moe

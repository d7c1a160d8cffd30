// Device side of braid-bench --moe: the token rows every rank makes, and the kernels of the NCCL baseline
// ("what frameworks do today"): route tokens per destination rank, gather rows per destination, and the
// weighted sum of what comes back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

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

// fp8 dispatch (--dispatch-type): element `index` is the fp8 value nearest k / 128 (saturating), and the scale of
// columns [128 c, 128 c + 128) of token t (index t * H / 128 + c) a power of two in 2^-2 .. 2^2, so the
// dequantised row is exact in bfloat16. Host and device agree on both.
BRAID_MOE_HD inline uint8_t token_fp8_bits(DataType type, uint64_t seed, int rank, uint64_t index) {
  const float value = static_cast<float>(token_value_k(seed, rank, index)) * (1.0f / 128.0f);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, type == DataType::kFloat8E5M2 ? __NV_E5M2 : __NV_E4M3));
}
BRAID_MOE_HD inline float token_scale(uint64_t seed, int rank, uint64_t index) {
  const int e = token_value_k(seed ^ 0x5CA1Eull, rank, index) % 3;  // -2 .. 2
  return e >= 0 ? static_cast<float>(1 << e) : 1.0f / static_cast<float>(1 << -e);
}
// The value of fp8 `bits` of `type` (exact in float).
BRAID_MOE_HD inline float fp8_value(DataType type, uint8_t bits) {
  const __half_raw half = __nv_cvt_fp8_to_halfraw(bits, type == DataType::kFloat8E5M2 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(half));
}

// Writes rank `rank`'s token rows [tokens, hidden] of `type` (kBFloat16, kFloat16, kFloat32, or an fp8 type)
// into x.
cudaError_t fill_tokens(DataType type, void* x, size_t tokens, size_t hidden, uint64_t seed, int rank,
                        cudaStream_t stream);
// Writes rank `rank`'s scales [tokens, hidden / 128] (token_scale) into scales.
cudaError_t fill_scales(float* scales, size_t tokens, size_t hidden, uint64_t seed, int rank, cudaStream_t stream);
// The experts' stand-in after an fp8 dispatch: y[r][h] = x[r][h] * scale of (r, h / 128) for r < rows, in
// out_type (kBFloat16, kFloat16, kFloat32); x's rows `x_stride` bytes apart, their scales (float32) at `scales`,
// `scale_stride` bytes apart.
cudaError_t dequantize_rows(DataType fp8_type, const void* x, size_t x_stride, const void* scales, size_t scale_stride,
                            size_t hidden, size_t rows, DataType out_type, void* y, cudaStream_t stream);

// The rank-major experts' stand-in: y[r][h] *= the sum of row r's top_k weights (float32 weights [rows, top_k]),
// in `type` (kBFloat16, kFloat16, kFloat32), for r < rows: each received token's rows summed over its experts here,
// when every expert's output is the token row itself.
cudaError_t weigh_rows(DataType type, void* y, size_t hidden, size_t rows, const float* weights, int top_k,
                       cudaStream_t stream);

// The routing of the baseline, from ids [tokens, top_k] (int64; ids outside [0, experts) are skipped) and weights
// [tokens, top_k]: for every destination rank d (which holds experts [d * L, (d + 1) * L), L = experts / world),
// lists[d * tokens + i] = the i-th token (in token order) with at least one expert on d, and send_counts[d] = how
// many; slots[t * world + d] = t's position in d's list or -1; weight_sums[t * world + d] = the sum of t's weights
// of experts on d. world <= 64.
cudaError_t route_tokens(const int64_t* ids, const float* weights, size_t tokens, int top_k, int experts, int world,
                         int32_t* lists, int32_t* slots, float* weight_sums, int64_t* send_counts, cudaStream_t stream);

// Packs the rows per destination: send[prefix(d) + i] = x[lists[d * tokens + i]] for i < send_counts[d], prefix(d) =
// the sum of send_counts[0..d) (read on the device). With `scales` (fp8 dispatch), each packed row is followed by
// its token's scale_bytes of scales (row and scale bytes multiples of 4).
cudaError_t gather_rows(DataType type, const void* x, size_t hidden, size_t tokens, int world, const int32_t* lists,
                        const int64_t* send_counts, void* send, cudaStream_t stream, const void* scales = nullptr,
                        size_t scale_bytes = 0);

// out[t] = sum over d with slots[t * world + d] >= 0 of weight_sums[t * world + d] * back[prefix(d) + slot], in
// float32, rounded once to `type`; zeros for a token sent nowhere. back is laid out as gather_rows's send.
cudaError_t weighted_sum(DataType type, const void* back, size_t hidden, size_t tokens, int world, const int32_t* slots,
                         const float* weight_sums, const int64_t* send_counts, void* out, cudaStream_t stream);

}  // namespace braid::bench::moe

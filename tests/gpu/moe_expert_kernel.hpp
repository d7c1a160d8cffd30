// A stand-in "expert" for the MoE tests: y[row] = scale(local_expert[row]) * x[row] (times the row's fp8 scales
// after an fp8 dispatch), exact in every token type (scale is ±1 or ±2, fp8 scales are powers of two), so the
// host reference knows every expert output without reading the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"

namespace braid::testing {

// The expert scale of local expert j (j >= 0): +1, -1, +2, -2 for j = 0, 1, 2, 3 (mod 4). The kernel uses the
// same rule.
inline double moe_expert_scale(int j) { return ((j & 1) != 0 ? -1.0 : 1.0) * ((j & 2) != 0 ? 2.0 : 1.0); }

// For every row < capacity_rows: y[row][h] = moe_expert_scale(local_expert[row]) * x[row][h] * s, hidden elements,
// x of `in_type` (kBFloat16, kFloat16, kFloat32, or fp8 with x_scales: s = x_scales[row][h / scale_columns]; s = 1
// without), y of `out_type` (kBFloat16, kFloat16 or kFloat32), rounded once; NaN in every element where the row is
// padding (local_expert outside [0, local_experts)) or at or past *rows_in_use (device int64; null: no bound).
// y may be x (in place) when the types are the same. Returns the launch's error.
cudaError_t moe_expert_rows(DataType in_type, const void* x, const float* x_scales, size_t scale_columns,
                            DataType out_type, void* y, const int32_t* local_expert, const int64_t* rows_in_use,
                            size_t capacity_rows, size_t hidden, int local_experts, cudaStream_t stream);

// The rank-major layout's expert: for every row s * rows_per_source + i with i < received_tokens[s] (device
// int64[world]), y[row][h] = the float32 sum, in order of k, of w_k * moe_expert_scale(topk_expert[row][k]) *
// x[row][h] * s over the row's k with topk_expert in [0, local_experts) (each term rounded to out_type, the sum
// once; w_k = topk_weights[row][k], or 1 when topk_weights is null): the per-rank partial an expert-major combine
// computes. NaN in every other row. x, x_scales and y as for moe_expert_rows; y may not be x.
cudaError_t moe_expert_tokens(DataType in_type, const void* x, const float* x_scales, size_t scale_columns,
                              DataType out_type, void* y, const int32_t* topk_expert, const float* topk_weights, int top_k,
                              size_t rows_per_source, const int64_t* received_tokens, int world, size_t hidden,
                              int local_experts, cudaStream_t stream);

}  // namespace braid::testing

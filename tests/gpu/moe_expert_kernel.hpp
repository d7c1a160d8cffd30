// A stand-in "expert" for the MoE tests: y[row] = scale(local_expert[row]) * x[row], exact in every token type
// (scale is ±1 or ±2), so the host reference knows every expert output without reading the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"

namespace braid::testing {

// The expert scale of local expert j (j >= 0): +1, -1, +2, -2 for j = 0, 1, 2, 3 (mod 4). The kernel uses the
// same rule.
inline double moe_expert_scale(int j) { return ((j & 1) != 0 ? -1.0 : 1.0) * ((j & 2) != 0 ? 2.0 : 1.0); }

// For every row < capacity_rows: y[row] = moe_expert_scale(local_expert[row]) * x[row] (hidden elements of
// `type`: kBFloat16, kFloat16 or kFloat32), or NaN in every element where the row is padding (local_expert outside
// [0, local_experts)) or at or past *rows_in_use (device int64; null: no bound). y may be x (in place). Returns
// the launch's error.
cudaError_t moe_expert_rows(DataType type, const void* x, void* y, const int32_t* local_expert,
                            const int64_t* rows_in_use, size_t capacity_rows, size_t hidden, int local_experts,
                            cudaStream_t stream);

}  // namespace braid::testing

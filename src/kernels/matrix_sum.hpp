// The local sum of equal-shaped matrices that fused GEMM + reduce-scatter adds as the C operand of its last GEMM.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "braid/types.hpp"

namespace braid::kernels {

// The most matrices one launch adds.
constexpr int kMaxSummands = 16;

// destination[i] = sum over s < count of sources[s][i], accumulated in float32 and rounded to `type` once, for
// i < elements, on at most `blocks` thread blocks. type: kBFloat16 or kFloat16; count in [1, kMaxSummands]. Plain
// launch (no dependent start).
void launch_matrix_sum(DataType type, void* destination, const void* const* sources, int count, size_t elements,
                       int blocks, cudaStream_t stream);

}  // namespace braid::kernels

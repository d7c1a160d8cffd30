// The bits of a float rounded (to nearest even) to bfloat16 or float16: what the fused GEMM tests compare outputs to.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "braid/types.hpp"

namespace braid::testing {

inline uint16_t bits_of(DataType type, float value) {
  uint16_t bits;
  if (type == DataType::kBFloat16) {
    const __nv_bfloat16 v = __float2bfloat16_rn(value);
    std::memcpy(&bits, &v, 2);
  } else {
    const __half v = __float2half_rn(value);
    std::memcpy(&bits, &v, 2);
  }
  return bits;
}

}  // namespace braid::testing

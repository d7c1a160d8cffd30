#include "moe_expert_kernel.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace braid::testing {
namespace {

// moe_expert_scale of the header, on the device.
__device__ __forceinline__ float scale_of(int j) { return ((j & 1) != 0 ? -1.0f : 1.0f) * ((j & 2) != 0 ? 2.0f : 1.0f); }

template <typename Bits>
__device__ __forceinline__ Bits scaled(Bits bits, float scale, int kind);

template <>
__device__ __forceinline__ uint16_t scaled<uint16_t>(uint16_t bits, float scale, int kind) {
  if (kind == 0) {  // bfloat16: exact (a power of two times ±1)
    const float value = __bfloat162float(__ushort_as_bfloat16(bits)) * scale;
    return __bfloat16_as_ushort(__float2bfloat16_rn(value));
  }
  const float value = __half2float(__ushort_as_half(bits)) * scale;
  return __half_as_ushort(__float2half_rn(value));
}

template <>
__device__ __forceinline__ uint32_t scaled<uint32_t>(uint32_t bits, float scale, int) {
  return __float_as_uint(__uint_as_float(bits) * scale);
}

template <typename Bits>
__global__ void expert_kernel(const Bits* x, Bits* y, const int32_t* local_expert, const int64_t* rows_in_use,
                              uint64_t capacity_rows, uint64_t hidden, int local_experts, int kind, Bits nan) {
  const uint64_t limit = rows_in_use == nullptr ? capacity_rows : static_cast<uint64_t>(*rows_in_use);
  for (uint64_t row = blockIdx.x; row < capacity_rows; row += gridDim.x) {
    const int j = local_expert[row];
    const bool real = row < limit && j >= 0 && j < local_experts;
    const float scale = real ? scale_of(j) : 0.0f;
    const Bits* in = x + row * hidden;
    Bits* out = y + row * hidden;
    for (uint64_t h = threadIdx.x; h < hidden; h += blockDim.x) out[h] = real ? scaled<Bits>(in[h], scale, kind) : nan;
  }
}

unsigned blocks_for(size_t rows) { return static_cast<unsigned>(rows < 1 ? 1 : (rows > 4096 ? 4096 : rows)); }

}  // namespace

cudaError_t moe_expert_rows(DataType type, const void* x, void* y, const int32_t* local_expert,
                            const int64_t* rows_in_use, size_t capacity_rows, size_t hidden, int local_experts,
                            cudaStream_t stream) {
  if (capacity_rows == 0 || hidden == 0) return cudaSuccess;
  const unsigned blocks = blocks_for(capacity_rows);
  switch (type) {
    case DataType::kBFloat16:
      expert_kernel<uint16_t><<<blocks, 128, 0, stream>>>(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y),
                                                           local_expert, rows_in_use, capacity_rows, hidden,
                                                           local_experts, 0, uint16_t(0x7FC0));
      break;
    case DataType::kFloat16:
      expert_kernel<uint16_t><<<blocks, 128, 0, stream>>>(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y),
                                                           local_expert, rows_in_use, capacity_rows, hidden,
                                                           local_experts, 1, uint16_t(0x7E00));
      break;
    case DataType::kFloat32:
      expert_kernel<uint32_t><<<blocks, 128, 0, stream>>>(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y),
                                                           local_expert, rows_in_use, capacity_rows, hidden,
                                                           local_experts, 2, 0x7FC00000u);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace braid::testing

#include "moe_expert_kernel.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace braid::testing {
namespace {

// moe_expert_scale of the header, on the device.
__device__ __forceinline__ float scale_of(int j) { return ((j & 1) != 0 ? -1.0f : 1.0f) * ((j & 2) != 0 ? 2.0f : 1.0f); }

// Element i of a row of `type`, as float (exact: every type here widens to float without rounding).
__device__ float load_element(DataType type, const void* row, uint64_t i) {
  switch (type) {
    case DataType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(row)[i]);
    case DataType::kFloat16: return __half2float(static_cast<const __half*>(row)[i]);
    case DataType::kFloat32: return static_cast<const float*>(row)[i];
    case DataType::kFloat8E4M3: return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(row)[i]);
    case DataType::kFloat8E5M2: return static_cast<float>(static_cast<const __nv_fp8_e5m2*>(row)[i]);
    default: return __int_as_float(0x7FC00000);
  }
}

// Rounded once to nearest; NaN stays NaN.
__device__ void store_element(DataType type, void* row, uint64_t i, float value) {
  switch (type) {
    case DataType::kBFloat16: static_cast<__nv_bfloat16*>(row)[i] = __float2bfloat16_rn(value); break;
    case DataType::kFloat16: static_cast<__half*>(row)[i] = __float2half_rn(value); break;
    case DataType::kFloat32: static_cast<float*>(row)[i] = value; break;
    default: break;
  }
}

__global__ void expert_kernel(DataType in_type, const char* x, const float* x_scales, uint64_t scale_columns,
                              DataType out_type, char* y, const int32_t* local_expert, const int64_t* rows_in_use,
                              uint64_t capacity_rows, uint64_t hidden, int local_experts, uint64_t in_row_bytes,
                              uint64_t out_row_bytes) {
  const uint64_t limit = rows_in_use == nullptr ? capacity_rows : static_cast<uint64_t>(*rows_in_use);
  const float nan = __int_as_float(0x7FC00000);
  const uint64_t scales_per_row = x_scales != nullptr ? hidden / scale_columns : 0;
  for (uint64_t row = blockIdx.x; row < capacity_rows; row += gridDim.x) {
    const int j = local_expert[row];
    const bool real = row < limit && j >= 0 && j < local_experts;
    const float scale = real ? scale_of(j) : 0.0f;
    const char* in = x + row * in_row_bytes;
    char* out = y + row * out_row_bytes;
    for (uint64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      float value = nan;
      if (real) {
        value = load_element(in_type, in, h) * scale;
        if (x_scales != nullptr) value *= x_scales[row * scales_per_row + h / scale_columns];
      }
      store_element(out_type, out, h, value);
    }
  }
}

// `value` rounded to `type` and widened back.
__device__ float rounded(DataType type, float value) {
  switch (type) {
    case DataType::kBFloat16: return __bfloat162float(__float2bfloat16_rn(value));
    case DataType::kFloat16: return __half2float(__float2half_rn(value));
    default: return value;
  }
}

// Rank-major: a row per received token; y[row] = sum over the row's pairs k here, in order of k, of
// w_k * (scale(topk_expert[row][k]) * x[row] * s) with float32 fused multiply-adds (w_k = 1 unweighted), the term
// rounded to out_type first and the sum once: what an expert-major combine computes for the same pairs.
__global__ void expert_tokens_kernel(DataType in_type, const char* x, const float* x_scales, uint64_t scale_columns,
                                     DataType out_type, char* y, const int32_t* topk_expert, const float* topk_weights,
                                     int top_k, uint64_t rows_per_source, const int64_t* received_tokens, int world,
                                     uint64_t hidden, int local_experts, uint64_t in_row_bytes, uint64_t out_row_bytes) {
  const float nan = __int_as_float(0x7FC00000);
  const uint64_t scales_per_row = x_scales != nullptr ? hidden / scale_columns : 0;
  const uint64_t rows = rows_per_source * static_cast<uint64_t>(world);
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint64_t source = row / rows_per_source, i = row % rows_per_source;
    const bool real = i < static_cast<uint64_t>(received_tokens[source]);
    const char* in = x + row * in_row_bytes;
    char* out = y + row * out_row_bytes;
    for (uint64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      float value = nan;
      if (real) {
        float element = load_element(in_type, in, h);
        if (x_scales != nullptr) element *= x_scales[row * scales_per_row + h / scale_columns];
        value = 0.0f;
        for (int k = 0; k < top_k; ++k) {
          const int j = topk_expert[row * top_k + k];
          if (j < 0 || j >= local_experts) continue;
          const float term = rounded(out_type, element * scale_of(j));  // as an expert-major y row holds it
          value = fmaf(topk_weights != nullptr ? topk_weights[row * top_k + k] : 1.0f, term, value);
        }
      }
      store_element(out_type, out, h, value);
    }
  }
}

unsigned blocks_for(size_t rows) { return static_cast<unsigned>(rows < 1 ? 1 : (rows > 4096 ? 4096 : rows)); }

bool is_fp8(DataType type) { return type == DataType::kFloat8E4M3 || type == DataType::kFloat8E5M2; }

}  // namespace

cudaError_t moe_expert_rows(DataType in_type, const void* x, const float* x_scales, size_t scale_columns,
                            DataType out_type, void* y, const int32_t* local_expert, const int64_t* rows_in_use,
                            size_t capacity_rows, size_t hidden, int local_experts, cudaStream_t stream) {
  const bool out_ok = out_type == DataType::kBFloat16 || out_type == DataType::kFloat16 || out_type == DataType::kFloat32;
  const bool in_ok = is_fp8(in_type) ? x_scales != nullptr && scale_columns > 0 && hidden % scale_columns == 0
                                     : x_scales == nullptr && in_type == out_type;
  if (!out_ok || !in_ok) return cudaErrorInvalidValue;
  if (capacity_rows == 0 || hidden == 0) return cudaSuccess;
  expert_kernel<<<blocks_for(capacity_rows), 128, 0, stream>>>(
      in_type, static_cast<const char*>(x), x_scales, scale_columns, out_type, static_cast<char*>(y), local_expert,
      rows_in_use, capacity_rows, hidden, local_experts, hidden * datatype_size(in_type), hidden * datatype_size(out_type));
  return cudaGetLastError();
}

cudaError_t moe_expert_tokens(DataType in_type, const void* x, const float* x_scales, size_t scale_columns,
                              DataType out_type, void* y, const int32_t* topk_expert, const float* topk_weights, int top_k,
                              size_t rows_per_source, const int64_t* received_tokens, int world, size_t hidden,
                              int local_experts, cudaStream_t stream) {
  const bool out_ok = out_type == DataType::kBFloat16 || out_type == DataType::kFloat16 || out_type == DataType::kFloat32;
  const bool in_ok = is_fp8(in_type) ? x_scales != nullptr && scale_columns > 0 && hidden % scale_columns == 0
                                     : x_scales == nullptr && in_type == out_type;
  if (!out_ok || !in_ok) return cudaErrorInvalidValue;
  const size_t rows = rows_per_source * static_cast<size_t>(world);
  if (rows == 0 || hidden == 0) return cudaSuccess;
  expert_tokens_kernel<<<blocks_for(rows), 128, 0, stream>>>(
      in_type, static_cast<const char*>(x), x_scales, scale_columns, out_type, static_cast<char*>(y), topk_expert,
      topk_weights, top_k, rows_per_source, received_tokens, world, hidden, local_experts, hidden * datatype_size(in_type),
      hidden * datatype_size(out_type));
  return cudaGetLastError();
}

}  // namespace braid::testing

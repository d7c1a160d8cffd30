#include "moe_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_scan.cuh>

namespace braid::bench::moe {
namespace {

constexpr int kMaxWorld = 64;

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T>
__global__ void fill_kernel(T* x, uint64_t count, uint64_t seed, int rank) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < count; i += uint64_t(gridDim.x) * blockDim.x) {
    x[i] = from_float<T>(static_cast<float>(token_value_k(seed, rank, i)) * (1.0f / 128.0f));
  }
}

constexpr int kRouteThreads = 1024;

// One block per destination rank: a block-wide scan over the tokens, in order, 1024 at a time.
__global__ void route_kernel(const int64_t* ids, const float* weights, uint64_t tokens, int top_k, int experts,
                             int world, int32_t* lists, int32_t* slots, float* weight_sums, int64_t* send_counts) {
  using Scan = cub::BlockScan<int, kRouteThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int d = blockIdx.x;
  const int local = experts / world;
  int running = 0;
  for (uint64_t base = 0; base < tokens; base += kRouteThreads) {
    const uint64_t t = base + threadIdx.x;
    int flag = 0;
    float sum = 0.0f;
    if (t < tokens) {
      for (int k = 0; k < top_k; ++k) {
        const int64_t e = ids[t * top_k + k];
        if (e >= 0 && e < experts && e / local == d) {
          flag = 1;
          sum += weights[t * top_k + k];
        }
      }
    }
    int position = 0, total = 0;
    Scan(temp).ExclusiveSum(flag, position, total);
    if (t < tokens) {
      slots[t * world + d] = flag ? running + position : -1;
      weight_sums[t * world + d] = sum;
      if (flag) lists[static_cast<uint64_t>(d) * tokens + running + position] = static_cast<int32_t>(t);
    }
    running += total;
    __syncthreads();  // temp is reused by the next chunk's scan
  }
  if (threadIdx.x == 0) send_counts[d] = running;
}

template <typename Word>
__global__ void gather_kernel(const Word* x, uint64_t row_words, const Word* scales, uint64_t scale_words,
                              uint64_t tokens, int world, const int32_t* lists, const int64_t* send_counts, Word* send) {
  const int d = blockIdx.y;
  int64_t prefix = 0;
  for (int q = 0; q < d; ++q) prefix += send_counts[q];
  const int64_t count = send_counts[d];
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const uint64_t token = static_cast<uint64_t>(lists[static_cast<uint64_t>(d) * tokens + i]);
    const Word* from = x + token * row_words;
    Word* to = send + static_cast<uint64_t>(prefix + i) * (row_words + scale_words);
    for (uint64_t w = threadIdx.x; w < row_words; w += blockDim.x) to[w] = from[w];
    for (uint64_t w = threadIdx.x; w < scale_words; w += blockDim.x) to[row_words + w] = scales[token * scale_words + w];
  }
}

__global__ void fill_fp8_kernel(uint8_t* x, uint64_t count, uint64_t seed, int rank, DataType type) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < count; i += uint64_t(gridDim.x) * blockDim.x) {
    x[i] = token_fp8_bits(type, seed, rank, i);
  }
}

__global__ void fill_scales_kernel(float* scales, uint64_t count, uint64_t seed, int rank) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < count; i += uint64_t(gridDim.x) * blockDim.x) {
    scales[i] = token_scale(seed, rank, i);
  }
}

template <typename T>
__global__ void dequantize_kernel(DataType fp8_type, const uint8_t* x, uint64_t x_stride, const char* scales,
                                  uint64_t scale_stride, uint64_t hidden, uint64_t rows, T* y) {
  for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint8_t* in = x + r * x_stride;
    const float* scale = reinterpret_cast<const float*>(scales + r * scale_stride);
    for (uint64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      y[r * hidden + h] = from_float<T>(fp8_value(fp8_type, in[h]) * scale[h / 128]);
    }
  }
}

// y[r][h] *= the sum of row r's top_k weights, rounded once.
template <typename T>
__global__ void weigh_rows_kernel(T* y, uint64_t hidden, uint64_t rows, const float* weights, int top_k) {
  for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float weight = 0;
    for (int k = 0; k < top_k; ++k) weight += weights[r * top_k + k];
    for (uint64_t h = threadIdx.x; h < hidden; h += blockDim.x) y[r * hidden + h] = from_float<T>(to_float(y[r * hidden + h]) * weight);
  }
}

template <typename T, int V>
__global__ void weighted_sum_kernel(const T* back, uint64_t hidden, uint64_t tokens, int world, const int32_t* slots,
                                    const float* weight_sums, const int64_t* send_counts, T* out) {
  __shared__ int64_t prefix[kMaxWorld];
  __shared__ int64_t row_of[kMaxWorld];  // this token's row in back per destination, -1: none
  __shared__ float weight_of[kMaxWorld];
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int q = 0; q < world; ++q) {
      prefix[q] = sum;
      sum += send_counts[q];
    }
  }
  __syncthreads();
  for (uint64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    if (static_cast<int>(threadIdx.x) < world) {
      const int32_t slot = slots[t * world + threadIdx.x];
      row_of[threadIdx.x] = slot < 0 ? -1 : prefix[threadIdx.x] + slot;
      weight_of[threadIdx.x] = weight_sums[t * world + threadIdx.x];
    }
    __syncthreads();
    for (uint64_t h = threadIdx.x * uint64_t(V); h < hidden; h += uint64_t(blockDim.x) * V) {
      float acc[V];
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] = 0.0f;
      for (int q = 0; q < world; ++q) {
        const int64_t row = row_of[q];
        if (row < 0) continue;
        const float w = weight_of[q];
        const Vec<T, V> in = *reinterpret_cast<const Vec<T, V>*>(back + static_cast<uint64_t>(row) * hidden + h);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] += w * to_float(in.v[v]);
      }
      Vec<T, V> result;
#pragma unroll
      for (int v = 0; v < V; ++v) result.v[v] = from_float<T>(acc[v]);
      *reinterpret_cast<Vec<T, V>*>(out + t * hidden + h) = result;
    }
    __syncthreads();  // row_of / weight_of are rewritten for the next token
  }
}

unsigned grid_for(uint64_t work, uint64_t per_block, unsigned most) {
  const uint64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > most ? most : blocks));
}

template <typename T>
cudaError_t weighted_sum_typed(const void* back, size_t hidden, size_t tokens, int world, const int32_t* slots,
                               const float* weight_sums, const int64_t* send_counts, void* out, cudaStream_t stream) {
  constexpr int kV = 16 / sizeof(T);
  const unsigned blocks = grid_for(tokens, 1, 4096);
  if (hidden % kV == 0) {
    weighted_sum_kernel<T, kV><<<blocks, 256, 0, stream>>>(static_cast<const T*>(back), hidden, tokens, world, slots,
                                                           weight_sums, send_counts, static_cast<T*>(out));
  } else {
    weighted_sum_kernel<T, 1><<<blocks, 256, 0, stream>>>(static_cast<const T*>(back), hidden, tokens, world, slots,
                                                          weight_sums, send_counts, static_cast<T*>(out));
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t fill_tokens(DataType type, void* x, size_t tokens, size_t hidden, uint64_t seed, int rank,
                        cudaStream_t stream) {
  const uint64_t count = static_cast<uint64_t>(tokens) * hidden;
  if (count == 0) return cudaSuccess;
  const unsigned blocks = grid_for(count, 256, 4096);
  switch (type) {
    case DataType::kBFloat16: fill_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(x), count, seed, rank); break;
    case DataType::kFloat16: fill_kernel<<<blocks, 256, 0, stream>>>(static_cast<__half*>(x), count, seed, rank); break;
    case DataType::kFloat32: fill_kernel<<<blocks, 256, 0, stream>>>(static_cast<float*>(x), count, seed, rank); break;
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2:
      fill_fp8_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint8_t*>(x), count, seed, rank, type);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t fill_scales(float* scales, size_t tokens, size_t hidden, uint64_t seed, int rank, cudaStream_t stream) {
  const uint64_t count = static_cast<uint64_t>(tokens) * (hidden / 128);
  if (count == 0) return cudaSuccess;
  fill_scales_kernel<<<grid_for(count, 256, 4096), 256, 0, stream>>>(scales, count, seed, rank);
  return cudaGetLastError();
}

cudaError_t dequantize_rows(DataType fp8_type, const void* x, size_t x_stride, const void* scales, size_t scale_stride,
                            size_t hidden, size_t rows, DataType out_type, void* y, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  if (hidden % 128 != 0 || (fp8_type != DataType::kFloat8E4M3 && fp8_type != DataType::kFloat8E5M2)) return cudaErrorInvalidValue;
  const unsigned blocks = grid_for(rows, 1, 4096);
  const auto* in = static_cast<const uint8_t*>(x);
  const auto* s = static_cast<const char*>(scales);
  switch (out_type) {
    case DataType::kBFloat16:
      dequantize_kernel<<<blocks, 256, 0, stream>>>(fp8_type, in, x_stride, s, scale_stride, hidden, rows,
                                                    static_cast<__nv_bfloat16*>(y));
      break;
    case DataType::kFloat16:
      dequantize_kernel<<<blocks, 256, 0, stream>>>(fp8_type, in, x_stride, s, scale_stride, hidden, rows, static_cast<__half*>(y));
      break;
    case DataType::kFloat32:
      dequantize_kernel<<<blocks, 256, 0, stream>>>(fp8_type, in, x_stride, s, scale_stride, hidden, rows, static_cast<float*>(y));
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t weigh_rows(DataType type, void* y, size_t hidden, size_t rows, const float* weights, int top_k,
                       cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  const unsigned blocks = grid_for(rows, 1, 4096);
  switch (type) {
    case DataType::kBFloat16:
      weigh_rows_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(y), hidden, rows, weights, top_k);
      break;
    case DataType::kFloat16: weigh_rows_kernel<<<blocks, 256, 0, stream>>>(static_cast<__half*>(y), hidden, rows, weights, top_k); break;
    case DataType::kFloat32: weigh_rows_kernel<<<blocks, 256, 0, stream>>>(static_cast<float*>(y), hidden, rows, weights, top_k); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t route_tokens(const int64_t* ids, const float* weights, size_t tokens, int top_k, int experts, int world,
                         int32_t* lists, int32_t* slots, float* weight_sums, int64_t* send_counts, cudaStream_t stream) {
  if (world < 1 || world > kMaxWorld) return cudaErrorInvalidValue;
  route_kernel<<<world, kRouteThreads, 0, stream>>>(ids, weights, tokens, top_k, experts, world, lists, slots,
                                                    weight_sums, send_counts);
  return cudaGetLastError();
}

cudaError_t gather_rows(DataType type, const void* x, size_t hidden, size_t tokens, int world, const int32_t* lists,
                        const int64_t* send_counts, void* send, cudaStream_t stream, const void* scales,
                        size_t scale_bytes) {
  if (world < 1 || world > kMaxWorld) return cudaErrorInvalidValue;
  const size_t row_bytes = hidden * datatype_size(type);
  if (row_bytes == 0 || tokens == 0) return cudaSuccess;
  if (scales != nullptr && (row_bytes % 4 != 0 || scale_bytes % 4 != 0)) return cudaErrorInvalidValue;
  if (scales == nullptr) scale_bytes = 0;
  const unsigned per_destination = world >= 2048 ? 1u : static_cast<unsigned>(2048 / world);
  const dim3 grid(grid_for(tokens, 1, per_destination), static_cast<unsigned>(world));
  auto launch = [&](auto word) {
    using Word = decltype(word);
    gather_kernel<<<grid, 256, 0, stream>>>(static_cast<const Word*>(x), row_bytes / sizeof(Word),
                                            static_cast<const Word*>(scales), scale_bytes / sizeof(Word), tokens, world,
                                            lists, send_counts, static_cast<Word*>(send));
  };
  if (row_bytes % 16 == 0 && scale_bytes % 16 == 0) {
    launch(uint4{});
  } else if (row_bytes % 4 == 0 && scale_bytes % 4 == 0) {
    launch(uint32_t{});
  } else {
    launch(uint16_t{});
  }
  return cudaGetLastError();
}

cudaError_t weighted_sum(DataType type, const void* back, size_t hidden, size_t tokens, int world, const int32_t* slots,
                         const float* weight_sums, const int64_t* send_counts, void* out, cudaStream_t stream) {
  if (world < 1 || world > kMaxWorld) return cudaErrorInvalidValue;
  if (tokens == 0 || hidden == 0) return cudaSuccess;
  switch (type) {
    case DataType::kBFloat16:
      return weighted_sum_typed<__nv_bfloat16>(back, hidden, tokens, world, slots, weight_sums, send_counts, out, stream);
    case DataType::kFloat16:
      return weighted_sum_typed<__half>(back, hidden, tokens, world, slots, weight_sums, send_counts, out, stream);
    case DataType::kFloat32:
      return weighted_sum_typed<float>(back, hidden, tokens, world, slots, weight_sums, send_counts, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace braid::bench::moe

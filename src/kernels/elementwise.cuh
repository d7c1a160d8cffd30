// Device primitives of the collective kernels: accumulation, reduction, 16-byte vectors, splits between blocks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>

#include "braid/device/copy_device.hpp"
#include "braid/types.hpp"
#include "kernels/block_slices.hpp"

namespace braid::kernels {

constexpr int kVectorBytes = 16;

// ---- Accumulation: 8- and 16-bit floats in float32, the rest in their own type (integers wrap).
template <typename T> struct Accumulator { using type = T; };
template <> struct Accumulator<__half> { using type = float; };
template <> struct Accumulator<__nv_bfloat16> { using type = float; };
template <> struct Accumulator<__nv_fp8_e4m3> { using type = float; };
template <> struct Accumulator<__nv_fp8_e5m2> { using type = float; };
template <typename T> using acc_t = typename Accumulator<T>::type;

template <typename T> __device__ __forceinline__ acc_t<T> to_acc(T value) { return static_cast<acc_t<T>>(value); }
template <> __device__ __forceinline__ float to_acc<__half>(__half value) { return __half2float(value); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 value) { return __bfloat162float(value); }
template <> __device__ __forceinline__ float to_acc<__nv_fp8_e4m3>(__nv_fp8_e4m3 value) { return static_cast<float>(value); }
template <> __device__ __forceinline__ float to_acc<__nv_fp8_e5m2>(__nv_fp8_e5m2 value) { return static_cast<float>(value); }
template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> value) { return static_cast<T>(value); }
template <> __device__ __forceinline__ __half from_acc<__half>(float value) { return __float2half_rn(value); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float value) { return __float2bfloat16_rn(value); }
// fp8 rounds to nearest even and saturates (NaN stays NaN), as NCCL's does.
template <> __device__ __forceinline__ __nv_fp8_e4m3 from_acc<__nv_fp8_e4m3>(float value) { return __nv_fp8_e4m3(value); }
template <> __device__ __forceinline__ __nv_fp8_e5m2 from_acc<__nv_fp8_e5m2>(float value) { return __nv_fp8_e5m2(value); }

template <ReduceOp Op, typename A>
__device__ __forceinline__ A combine(A a, A b) {
  if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) return static_cast<A>(a + b);
  else if constexpr (Op == ReduceOp::kProd) return static_cast<A>(a * b);
  else if constexpr (Op == ReduceOp::kMax) return a > b ? a : b;
  else return a < b ? a : b;
}

// avg divides the sum once, at the end (integers truncate, as ncclAvg).
template <ReduceOp Op, typename A>
__device__ __forceinline__ A finish(A value, int world) {
  if constexpr (Op == ReduceOp::kAvg) return static_cast<A>(value / static_cast<A>(world));
  else return value;
}

template <typename T>
struct alignas(kVectorBytes) Vector {
  static constexpr int kCount = kVectorBytes / sizeof(T);
  T value[kCount];
};

template <typename T>
__device__ __forceinline__ Vector<T> load_vector(const void* address) {
  uint4 raw = *static_cast<const uint4*>(address);
  return *reinterpret_cast<Vector<T>*>(&raw);
}

// A hint: no register waits for it.
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}
constexpr int kPrefetchLineBytes = 128;

// `address` may be unaligned (a user buffer offset by an element).
template <typename T>
__device__ __forceinline__ void store_vector(void* address, const Vector<T>& vector) {
  if ((reinterpret_cast<uintptr_t>(address) & (kVectorBytes - 1)) == 0) {
    *static_cast<uint4*>(address) = *reinterpret_cast<const uint4*>(&vector);
  } else {
    T* out = static_cast<T*>(address);
#pragma unroll
    for (int i = 0; i < Vector<T>::kCount; ++i) out[i] = vector.value[i];
  }
}

// In rank order, as every reduction here: bit-identical results on every rank.
template <typename T, ReduceOp Op>
__device__ __forceinline__ Vector<T> reduce_vector(const char* const* sources, int count, size_t offset, int world) {
  Vector<T> first = load_vector<T>(sources[0] + offset);
  acc_t<T> acc[Vector<T>::kCount];
#pragma unroll
  for (int i = 0; i < Vector<T>::kCount; ++i) acc[i] = to_acc(first.value[i]);
  for (int s = 1; s < count; ++s) {
    Vector<T> next = load_vector<T>(sources[s] + offset);
#pragma unroll
    for (int i = 0; i < Vector<T>::kCount; ++i) acc[i] = combine<Op>(acc[i], to_acc(next.value[i]));
  }
  Vector<T> out;
#pragma unroll
  for (int i = 0; i < Vector<T>::kCount; ++i) out.value[i] = from_acc<T>(finish<Op>(acc[i], world));
  return out;
}

// 16-byte accesses a thread keeps in flight: NVLink and HBM need many outstanding requests.
constexpr int kUnroll = device::kLoadsInFlight;

using device::block_copy;
using device::block_copy_to;
using device::group_copy_to;
using device::warp_copy;

// ---- Splitting elements between blocks in whole vectors of T, the last taking the tail (block_slices.hpp).
template <typename T>
__device__ __forceinline__ Slice block_slice(size_t count, int block, int blocks) {
  return split_elements(count, block, blocks, Vector<T>::kCount);
}

// Sources whose loads a thread issues together (block_reduce's Batch) when loading from peers: one NVLink round
// trip per batch. Fewer as accumulators grow, against spills: 4 for 4- and 8-byte types, 2 for 16-bit, 1 for
// 8-bit. Pipelined kernels reduce from their own memory with Batch 1.
template <typename T>
constexpr int kAccumulatorRegisters = kUnroll * Vector<T>::kCount * (sizeof(acc_t<T>) < 4 ? 4 : sizeof(acc_t<T>)) / 4;
template <typename T>
constexpr int kLoadBatch = kAccumulatorRegisters<T> <= 16 ? 4 : kAccumulatorRegisters<T> <= 32 ? 2 : 1;
static_assert(kLoadBatch<float> == 4 && kLoadBatch<double> == 4 && kLoadBatch<int64_t> == 4 &&
                  kLoadBatch<__nv_bfloat16> == 2 && kLoadBatch<__half> == 2 && kLoadBatch<int8_t> == 1,
              "the batches the comment above names (ptxas -v, sm_90: two instantiations spill 12 bytes, uint64 and bf16 avg)");

// kUnroll vectors `stride` elements apart from element `e`, all inside the slice.
template <typename T, ReduceOp Op, int Batch>
__device__ __forceinline__ void reduce_unrolled(const char* const* sources, int source_count, char* const* destinations,
                                                int destination_count, size_t e, size_t stride,
                                                size_t source_offset_bytes, size_t destination_offset_bytes, int world) {
  constexpr int kPer = Vector<T>::kCount;
  acc_t<T> acc[kUnroll][kPer];
  Vector<T> in[Batch][kUnroll];
  if constexpr (Batch == 1) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) in[0][u] = load_vector<T>(sources[0] + source_offset_bytes + (e + u * stride) * sizeof(T));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[u][i] = to_acc(in[0][u].value[i]);
    }
    for (int s = 1; s < source_count; ++s) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) in[0][u] = load_vector<T>(sources[s] + source_offset_bytes + (e + u * stride) * sizeof(T));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[u][i] = combine<Op>(acc[u][i], to_acc(in[0][u].value[i]));
      }
    }
  } else {
    for (int first = 0; first < source_count; first += Batch) {
#pragma unroll
      for (int b = 0; b < Batch; ++b) {
        if (first + b < source_count) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            in[b][u] = load_vector<T>(sources[first + b] + source_offset_bytes + (e + u * stride) * sizeof(T));
          }
        }
      }
#pragma unroll
      for (int b = 0; b < Batch; ++b) {
        if (first + b >= source_count) break;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int i = 0; i < kPer; ++i) {
            acc[u][i] = first + b == 0 ? to_acc(in[b][u].value[i]) : combine<Op>(acc[u][i], to_acc(in[b][u].value[i]));
          }
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) in[0][u].value[i] = from_acc<T>(finish<Op>(acc[u][i], world));
  }
  for (int d = 0; d < destination_count; ++d) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) store_vector(destinations[d] + destination_offset_bytes + (e + u * stride) * sizeof(T), in[0][u]);
  }
}

// Reduces [slice) of `sources` into every destination.
template <typename T, ReduceOp Op, int Batch = 1>
__device__ inline void block_reduce(const char* const* sources, int source_count, char* const* destinations,
                                    int destination_count, const Slice& slice, size_t source_offset_bytes,
                                    size_t destination_offset_bytes, int world) {
  constexpr size_t kPer = Vector<T>::kCount;
  const size_t stride = blockDim.x * kPer;
  size_t e = slice.begin + threadIdx.x * kPer;
  for (; e + (kUnroll - 1) * stride < slice.vector_end; e += kUnroll * stride) {
    reduce_unrolled<T, Op, Batch>(sources, source_count, destinations, destination_count, e, stride, source_offset_bytes,
                           destination_offset_bytes, world);
  }
  for (; e < slice.vector_end; e += stride) {
    Vector<T> value = reduce_vector<T, Op>(sources, source_count, source_offset_bytes + e * sizeof(T), world);
    for (int d = 0; d < destination_count; ++d) store_vector(destinations[d] + destination_offset_bytes + e * sizeof(T), value);
  }
  for (size_t t = slice.vector_end + threadIdx.x; t < slice.end; t += blockDim.x) {
    acc_t<T> acc = to_acc(*reinterpret_cast<const T*>(sources[0] + source_offset_bytes + t * sizeof(T)));
    for (int s = 1; s < source_count; ++s) {
      acc = combine<Op>(acc, to_acc(*reinterpret_cast<const T*>(sources[s] + source_offset_bytes + t * sizeof(T))));
    }
    const T value = from_acc<T>(finish<Op>(acc, world));
    for (int d = 0; d < destination_count; ++d) *reinterpret_cast<T*>(destinations[d] + destination_offset_bytes + t * sizeof(T)) = value;
  }
}

}  // namespace braid::kernels

// braid's Hopper GEMM (matmul_sm90.cu), its epilogue: a consumer warpgroup's accumulators stored to D, 16 bytes a
// lane after a transpose within each quad of lanes (NOTE [Hopper GEMM]). Included by matmul_sm90.cu alone, whose
// anonymous namespace its pieces join.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

namespace braid::kernels {
namespace {

struct Epilogue {
  void* d;
  const void* c;  // null: no C
  float alpha, beta;
  int rows, n;
};

template <typename T>
struct Pack;
template <>
struct Pack<__nv_bfloat16> {
  static __device__ uint32_t to(float x, float y) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ float2 from(uint32_t word) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
  }
};
template <>
struct Pack<__half> {
  static __device__ uint32_t to(float x, float y) {
    const __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ float2 from(uint32_t word) { return __half22float2(*reinterpret_cast<const __half2*>(&word)); }
};

// Lane q of a quad holds the pair of columns 2q, 2q+1 of groups 0-3 (8 columns each) in v[0..3]; afterwards it
// holds the 4 pairs of group q, in order. V is a pair: two floats, or two 16-bit values in one word.
__device__ __forceinline__ uint32_t exchange(uint32_t v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ float2 exchange(float2 v, int mask) {
  return make_float2(__shfl_xor_sync(0xffffffffu, v.x, mask), __shfl_xor_sync(0xffffffffu, v.y, mask));
}
template <typename V>
__device__ __forceinline__ void quad_transpose(V (&v)[4], int lane) {
  const bool high = lane & 2;
  {
    const V x0 = exchange(high ? v[0] : v[2], 2), x1 = exchange(high ? v[1] : v[3], 2);
    if (high) {
      v[0] = x0;
      v[1] = x1;
    } else {
      v[2] = x0;
      v[3] = x1;
    }
  }
  const bool odd = lane & 1;
  const V x0 = exchange(odd ? v[0] : v[1], 1), x1 = exchange(odd ? v[2] : v[3], 1);
  if (odd) {
    v[0] = x0;
    v[2] = x1;
  } else {
    v[1] = x0;
    v[3] = x1;
  }
}

// Lane `lane`'s 16 bytes of its row `half` (0: its first row, 1: the one 8 below) after the quad transpose: its
// accumulators' columns of groups g to g + 3 rounded to T, transposed so that the lane holds group g + lane % 4.
template <typename T>
__device__ __forceinline__ uint4 rounded_group(const float (&acc)[128], int half, int g, int lane) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = Pack<T>::to(acc[4 * (g + i) + 2 * half], acc[4 * (g + i) + 2 * half + 1]);
  quad_transpose(w, lane);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Rows [row0, row0 + 64) and columns [col0, col0 + 256) of D from this warpgroup's accumulators, where thread t holds
// rows 16 (t / 32) + (t % 32) / 4 (+ 8) and columns 8j + 2 (t % 4) (+ 1) of every group j of 8 columns. Each lane
// stores 16 bytes a row: 8 columns of one group, after a transpose within its quad. Without C and with alpha 1 the
// lanes round first and exchange 16-bit pairs; otherwise they exchange float32 pairs, and each lane loads its C
// (16 bytes a group) for 8 groups before it stores any of them (C may be D itself: each lane reads only what it
// writes).
template <typename T>
__device__ __forceinline__ void store_tile(const float (&acc)[128], const Epilogue& e, int row0, int col0, int tid) {
  const int lane = tid % 32;
  const int row = row0 + (tid / 32) * 16 + lane / 4;
  const bool plain = e.c == nullptr && e.alpha == 1.0f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row + 8 * half;
    const bool row_in = r < e.rows;  // every lane takes part in the exchanges, rows past D's too
    T* d_row = static_cast<T*>(e.d) + size_t(r) * e.n;
    if (plain) {
#pragma unroll
      for (int g = 0; g < 32; g += 4) {
        const uint4 words = rounded_group<T>(acc, half, g, lane);
        const int col = col0 + (g + lane % 4) * 8;
        if (row_in && col < e.n) *reinterpret_cast<uint4*>(d_row + col) = words;
      }
      continue;
    }
    uint4 c[8];
    if (e.c != nullptr) {
      const T* c_row = static_cast<const T*>(e.c) + size_t(r) * e.n;
#pragma unroll
      for (int g = 0; g < 32; g += 4) {
        const int col = col0 + (g + lane % 4) * 8;
        c[g / 4] = row_in && col < e.n ? *reinterpret_cast<const uint4*>(c_row + col) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int g = 0; g < 32; g += 4) {
      float2 v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = make_float2(acc[4 * (g + i) + 2 * half], acc[4 * (g + i) + 2 * half + 1]);
      quad_transpose(v, lane);
      const int col = col0 + (g + lane % 4) * 8;
      if (!row_in || col >= e.n) continue;
      uint32_t out[4];
      if (e.c != nullptr) {
        const uint32_t words[4] = {c[g / 4].x, c[g / 4].y, c[g / 4].z, c[g / 4].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 cv = Pack<T>::from(words[i]);
          out[i] = Pack<T>::to(e.alpha * v[i].x + e.beta * cv.x, e.alpha * v[i].y + e.beta * cv.y);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = Pack<T>::to(e.alpha * v[i].x, e.alpha * v[i].y);
      }
      *reinterpret_cast<uint4*>(d_row + col) = make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
}

}  // namespace
}  // namespace braid::kernels

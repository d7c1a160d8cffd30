// Device primitives for NVLink multicast (NVLS, sm_90+): through a multicast address (a mapping of a multicast
// object), one instruction reaches the copy of every GPU bound to the object. No public call returns a multicast
// mapping: the one braid makes (only with BRAID_ENABLE_MULTICAST=1: docs/multicast.md) serves its own
// collectives. A user's kernel needs a multicast object its program made, bound and mapped itself (the CUDA
// driver's cuMulticastGetGranularity, cuMulticastCreate, cuMulticastAddDevice, cuMulticastBindMem or
// cuMulticastBindAddr, cuMemAddressReserve, cuMemMap, cuMemSetAccess).
//   - multimem_load_reduce<T, Op>(address): loads the 16-byte vector at `address` from every GPU's copy and
//     returns their reduction (the NVSwitch reduces; each byte crosses NVLink once);
//   - multimem_store(address, value): stores a 16-byte vector into every GPU's copy.
// Addresses must be 16-byte aligned and inside a multicast mapping. Both are relaxed at system scope: after
// multimem_store, __threadfence_system() then a release (device::barrier) before peers read; a
// multimem_load_reduce only after a barrier that follows every peer's writes to the vector. Built for an
// architecture below sm_90, both compile and trap when called.
//
// Which reductions multimem_load_reduce issues (a subset of PTX multimem.ld_reduce, which also reduces integer
// types braid does not issue): float32 sum only (no min or max); float16 and bfloat16 sum (accumulated in
// float32, .acc::f32), min and max. multimem_reduces<T, Op>() says which; other pairs must take the unicast
// algorithms. Never run these on a GPU host shared with other users: a multicast
// program can take the host's GPUs out of service (docs/multicast.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "braid/types.hpp"

namespace braid::device {

template <typename T, ReduceOp Op>
__host__ __device__ constexpr bool multimem_reduces() {
  if constexpr (std::is_same_v<T, float>) return Op == ReduceOp::kSum;
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return Op == ReduceOp::kSum || Op == ReduceOp::kMin || Op == ReduceOp::kMax;
  }
  return false;
}

// The same table for a run-time (type, op), for host code choosing an algorithm.
template <typename T>
__host__ __device__ constexpr bool multimem_reduces_with(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return multimem_reduces<T, ReduceOp::kSum>();
    case ReduceOp::kProd: return multimem_reduces<T, ReduceOp::kProd>();
    case ReduceOp::kMax: return multimem_reduces<T, ReduceOp::kMax>();
    case ReduceOp::kMin: return multimem_reduces<T, ReduceOp::kMin>();
    case ReduceOp::kAvg: return multimem_reduces<T, ReduceOp::kAvg>();
  }
  return false;
}
__host__ __device__ constexpr bool multimem_reduces(DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32: return multimem_reduces_with<float>(op);
    case DataType::kFloat16: return multimem_reduces_with<__half>(op);
    case DataType::kBFloat16: return multimem_reduces_with<__nv_bfloat16>(op);
    default: return false;
  }
}

#if defined(__CUDACC__)  // the instructions; host code sees only the table above

#define BRAID_MULTIMEM_LD_REDUCE(instruction)                                                  \
  asm volatile(instruction " {%0, %1, %2, %3}, [%4];"                                         \
               : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)                   \
               : "l"(address)                                                                 \
               : "memory")

template <typename T, ReduceOp Op>
__device__ __forceinline__ uint4 multimem_load_reduce(const void* address) {
  static_assert(multimem_reduces<T, Op>(), "the hardware cannot reduce this type with this op (multimem_reduces)");
  uint4 value;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (std::is_same_v<T, float>) {
    BRAID_MULTIMEM_LD_REDUCE("multimem.ld_reduce.relaxed.sys.global.add.v4.f32");
  } else if constexpr (std::is_same_v<T, __half>) {
    if constexpr (Op == ReduceOp::kSum) BRAID_MULTIMEM_LD_REDUCE("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2");
    if constexpr (Op == ReduceOp::kMin) BRAID_MULTIMEM_LD_REDUCE("multimem.ld_reduce.relaxed.sys.global.min.v4.f16x2");
    if constexpr (Op == ReduceOp::kMax) BRAID_MULTIMEM_LD_REDUCE("multimem.ld_reduce.relaxed.sys.global.max.v4.f16x2");
  } else {
    if constexpr (Op == ReduceOp::kSum) BRAID_MULTIMEM_LD_REDUCE("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2");
    if constexpr (Op == ReduceOp::kMin) BRAID_MULTIMEM_LD_REDUCE("multimem.ld_reduce.relaxed.sys.global.min.v4.bf16x2");
    if constexpr (Op == ReduceOp::kMax) BRAID_MULTIMEM_LD_REDUCE("multimem.ld_reduce.relaxed.sys.global.max.v4.bf16x2");
  }
#else
  (void)address;
  value = make_uint4(0, 0, 0, 0);
  __trap();  // multimem needs sm_90
#endif
  return value;
}

#undef BRAID_MULTIMEM_LD_REDUCE

// The vector's 16 bytes as they are (stored as four float32 lanes: a store converts nothing).
__device__ __forceinline__ void multimem_store(void* address, uint4 value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(value.x),
               "r"(value.y), "r"(value.z), "r"(value.w)
               : "memory");
#else
  (void)address;
  (void)value;
  __trap();  // multimem needs sm_90
#endif
}

#endif  // __CUDACC__

}  // namespace braid::device

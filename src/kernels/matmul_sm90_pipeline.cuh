// braid's Hopper GEMM (matmul_sm90.cu), its primitives: shared-memory barriers (mbarrier), the cluster, the copy
// engine's (TMA) tensor loads and stores, and wgmma. Included by matmul_sm90.cu alone, whose anonymous namespace
// its pieces join.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/matmul_sm90_shape.cuh"

namespace braid::kernels {
namespace {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* barrier, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(count));
}

__device__ __forceinline__ void barrier_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ uint64_t global_time_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// Waits for the phase of `parity` to complete; traps after limit_ns() nanoseconds (wait_limit_ns), which is read only
// once the wait has lasted, so that it holds no register in the multiplications' loop.
template <typename Limit>
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, uint32_t parity, Limit&& limit_ns) {
  const uint32_t address = shared_address(barrier);
  uint64_t start = 0;
  for (uint32_t spins = 1;; ++spins) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
    if (done) return;
    if ((spins & 0xFFFF) == 0) {
      const uint64_t now = global_time_ns();
      if (start == 0) {
        start = now;
      } else if (now - start > limit_ns()) {
        __trap();
      }
    }
  }
}

__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}

// Arrives on the barrier at the same offset in block `block` of the cluster (this block included).
__device__ __forceinline__ void barrier_arrive_in(uint64_t* barrier, uint32_t block) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(barrier)), "r"(block));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

__device__ __forceinline__ uint32_t cluster_block() {
  uint32_t block;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(block));
  return block;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive;\nbarrier.cluster.wait;" ::: "memory");
}

// Loads the box at (x = column, y = row) into `destination` of every block of the cluster, completing on each
// block's barrier at `barrier`'s offset.
__device__ __forceinline__ void tma_load_multicast(void* destination, const CUtensorMap* map, int x, int y,
                                                   uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(shared_address(destination)),
      "l"(map), "r"(x), "r"(y), "r"(shared_address(barrier)), "h"(uint16_t((1u << kCluster) - 1))
      : "memory");
}

// Stores the box at (x = column, y = row) of `map` from `source`, in this thread's current bulk group.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, int x, int y, const void* source) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map), "r"(x),
               "r"(y), "r"(shared_address(source))
               : "memory");
}

__device__ __forceinline__ void tma_load(void* destination, const CUtensorMap* map, int x, int y, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          shared_address(destination)),
      "l"(map), "r"(x), "r"(y), "r"(shared_address(barrier))
      : "memory");
}
// Closes this thread's bulk group and waits until its copies have been performed.
__device__ __forceinline__ void bulk_stores_complete() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group 0;" ::: "memory");
}


// wgmma's descriptor of a K-major operand in 128-byte swizzled rows (8-row groups 1024 bytes apart).
__device__ __forceinline__ uint64_t operand_descriptor(const void* p) {
  uint64_t descriptor = (shared_address(p) & 0x3FFFF) >> 4;
  descriptor |= uint64_t(1) << 16;            // leading byte offset: unused by swizzled K-major operands
  descriptor |= uint64_t(1024 >> 4) << 32;    // stride byte offset
  descriptor |= uint64_t(1) << 62;            // 128-byte swizzle
  return descriptor;
}

#define BRAID_WGMMA_OPERANDS                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                        \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "               \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "               \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "               \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "   \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define BRAID_ACC8(i)                                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define BRAID_ACC32(i) BRAID_ACC8(i), BRAID_ACC8(i + 8), BRAID_ACC8(i + 16), BRAID_ACC8(i + 24)
#define BRAID_WGMMA_M64N256K16(name, types)                                                                   \
  __device__ __forceinline__ void name(float(&d)[128], uint64_t a, uint64_t b, int accumulate) {              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." types " " BRAID_WGMMA_OPERANDS                \
                 ", %128, %129, p, 1, 1, 0, 0;\n}\n"                                                          \
                 : BRAID_ACC32(0), BRAID_ACC32(32), BRAID_ACC32(64), BRAID_ACC32(96)                          \
                 : "l"(a), "l"(b), "r"(accumulate));                                                          \
  }
// D (64 x 256, float32) += A (64 x 16) x B (256 x 16)^T, both from shared memory; `accumulate` 0 overwrites D.
BRAID_WGMMA_M64N256K16(wgmma_bf16, "bf16.bf16")
BRAID_WGMMA_M64N256K16(wgmma_f16, "f16.f16")
#undef BRAID_WGMMA_M64N256K16
#undef BRAID_ACC32
#undef BRAID_ACC8
#undef BRAID_WGMMA_OPERANDS

template <typename T>
__device__ __forceinline__ void wgmma(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    wgmma_bf16(d, a, b, accumulate);
  } else {
    wgmma_f16(d, a, b, accumulate);
  }
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

}  // namespace
}  // namespace braid::kernels

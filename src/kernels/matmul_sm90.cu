// braid's Hopper GEMM (matmul_sm90.hpp). Built for sm_90a alone (src/CMakeLists.txt): wgmma and setmaxnreg exist
// only there.
#include "kernels/matmul_sm90.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>

#include "core/cuda_driver.hpp"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

// NOTE [Hopper GEMM]
// One persistent kernel: each thread block loops over 128 x 256 tiles of D, and the two blocks of a cluster take
// vertically adjacent tiles (one 256 x 256 unit), so each loads its own 128 rows of A and half of the 256 rows of
// B, and the copy engine (TMA) multicasts that half into both blocks' shared memory: a block reads 32 KiB of L2 a
// step instead of 48. Units go out in bands of kBandUnits rows of units, column by column, so the blocks working at
// once share A and B in L2.
// Each block has three warpgroups. The producer's one thread keeps kStages steps of 64 columns of K in flight:
// it waits for a stage's `empty` barrier, arms its `full` barrier with the bytes to come, and starts the loads. The
// two consumer warpgroups multiply rows 0-63 and 64-127 of the tile by all 256 columns (wgmma m64n256k16,
// accumulators in registers, 128 a thread), each waiting on `full`, issuing a step's four wgmmas, and releasing the
// step before (wgmma.wait_group 1: one step stays in flight) to the `empty` barriers of both blocks of the cluster,
// since the other block's multicast writes this block's stage too (empty counts 2 warpgroups x 2 blocks).
// Stages are 128-byte swizzled (the TMA's layout is the one wgmma's descriptors name), so nothing reorders them.
// The epilogue turns each lane's two columns of every 8 into one lane's 8 columns (a transpose within each quad of
// lanes: of rounded 16-bit pairs where there is no C and alpha is 1, else of float32 pairs, to which each lane adds
// alpha and beta x C from 16-byte loads), so each lane stores 16 bytes: storing the accumulators' own layout, 4 bytes
// a lane, took about as long as a tenth of the tile's multiplications.
// Every barrier wait is bounded (kWaitLimitNs, then the kernel traps); none waits on another GPU.
constexpr int kTileRows = 128, kTileCols = 256, kTileK = 64;
constexpr int kStages = 4;
constexpr int kCluster = 2;
constexpr int kThreads = 3 * 128;
constexpr int kBandUnits = 8;
constexpr uint32_t kATileBytes = kTileRows * kTileK * 2, kBTileBytes = kTileCols * kTileK * 2;
constexpr uint32_t kStageBytes = kATileBytes + kBTileBytes;
constexpr size_t kSharedBytes = size_t(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t) + 1024;  // + alignment
constexpr uint64_t kWaitLimitNs = 10'000'000'000ull;

struct Epilogue {
  void* d;
  const void* c;  // null: no C
  float alpha, beta;
  int rows, n;
};

struct Schedule {
  int m_units, n_blocks;  // units: pairs of 128-row blocks of D by 256-column blocks
  // The first 128-row block and the column block of unit `u`.
  __device__ void unit(int u, int& m_block, int& n_block) const {
    const int per_band = kBandUnits * n_blocks;
    const int band = u / per_band, in_band = u % per_band;
    const int first = band * kBandUnits;
    const int height = min(kBandUnits, m_units - first);
    m_block = (first + in_band % height) * kCluster;
    n_block = in_band / height;
  }
};

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

// Waits for the phase of `parity` to complete; traps after kWaitLimitNs.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, uint32_t parity) {
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
      } else if (now - start > kWaitLimitNs) {
        __trap();
      }
    }
  }
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

__device__ __forceinline__ void tma_load(void* destination, const CUtensorMap* map, int x, int y, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          shared_address(destination)),
      "l"(map), "r"(x), "r"(y), "r"(shared_address(barrier))
      : "memory");
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
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = Pack<T>::to(acc[4 * (g + i) + 2 * half], acc[4 * (g + i) + 2 * half + 1]);
        quad_transpose(w, lane);
        const int col = col0 + (g + lane % 4) * 8;
        if (row_in && col < e.n) *reinterpret_cast<uint4*>(d_row + col) = make_uint4(w[0], w[1], w[2], w[3]);
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

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_sm90(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b, Epilogue epilogue,
                Schedule schedule, int k) {
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* a_tiles = shared;
  uint8_t* b_tiles = shared + kStages * kATileBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int group = threadIdx.x / 128, tid = threadIdx.x % 128;
  const uint32_t block = cluster_block();
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], 2 * kCluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();
  const int units = schedule.m_units * schedule.n_blocks;
  const int first_unit = blockIdx.x / kCluster, unit_step = gridDim.x / kCluster;
  const int k_steps = (k + kTileK - 1) / kTileK;
  if (group == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int u = first_unit; u < units; u += unit_step) {
        int m_block, n_block;
        schedule.unit(u, m_block, n_block);
        m_block += block;
        for (int step = 0; step < k_steps; ++step) {
          barrier_wait(&empty[stage], phase ^ 1);
          barrier_expect_bytes(&full[stage], kStageBytes);
          tma_load(a_tiles + stage * kATileBytes, &map_a, step * kTileK, m_block * kTileRows, &full[stage]);
          constexpr int part = kTileCols / kCluster;
          tma_load_multicast(b_tiles + stage * kBTileBytes + block * part * kTileK * 2, &map_b, step * kTileK,
                             n_block * kTileCols + block * part, &full[stage]);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int consumer = group - 1;
    // Warp w's lane 0 releases stages to block w of the cluster.
    const bool releases = tid % 32 == 0 && tid / 32 < kCluster;
    float acc[128];
    int stage = 0;
    uint32_t phase = 0;
    for (int u = first_unit; u < units; u += unit_step) {
      int m_block, n_block;
      schedule.unit(u, m_block, n_block);
      m_block += block;
      int previous = -1;
      for (int step = 0; step < k_steps; ++step) {
        barrier_wait(&full[stage], phase);
        wgmma_fence();
        const uint8_t* a = a_tiles + stage * kATileBytes + consumer * 64 * kTileK * 2;
        const uint8_t* b = b_tiles + stage * kBTileBytes;
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          wgmma<T>(acc, operand_descriptor(a + kk * 32), operand_descriptor(b + kk * 32), (step > 0 || kk > 0) ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (previous >= 0 && releases) barrier_arrive_in(&empty[previous], tid / 32);
        previous = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      if (releases) barrier_arrive_in(&empty[previous], tid / 32);
      store_tile<T>(acc, epilogue, m_block * kTileRows + consumer * 64, n_block * kTileCols, tid);
    }
  }
  cluster_sync();  // no block leaves while the other may still multicast into it or release its stages
}

cudaLaunchConfig_t launch_config(int blocks, cudaStream_t stream, cudaLaunchAttribute& cluster) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSharedBytes;
  config.stream = stream;
  cluster = cudaLaunchAttribute{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCluster;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return config;
}

// The most blocks of the kernel for `type` that run at once on `device` (whole clusters), its shared-memory limit
// raised on first use; 0 where that fails.
int resident_blocks(int device, DataType type) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, static_cast<int>(type));
  if (const auto found = known.find(key); found != known.end()) return found->second;
  const void* kernel = type == DataType::kBFloat16 ? reinterpret_cast<const void*>(&matmul_sm90<__nv_bfloat16>)
                                                   : reinterpret_cast<const void*>(&matmul_sm90<__half>);
  int clusters = 0;
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config = launch_config(kCluster, nullptr, cluster);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSharedBytes)) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    clusters = 0;
  }
  known[key] = clusters * kCluster;
  return clusters * kCluster;
}

bool tensor_map(CUtensorMap& map, DataType type, const void* base, size_t rows, size_t k, uint32_t box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kTileK), box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUtensorMapDataType data_type =
      type == DataType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return driver().cuTensorMapEncodeTiled(&map, data_type, 2, const_cast<void*>(base), dims, strides, box,
                                         element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool sm90_matmul_available(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0 && driver().cuTensorMapEncodeTiled != nullptr &&
         resident_blocks(device, DataType::kBFloat16) >= kCluster &&
         resident_blocks(device, DataType::kFloat16) >= kCluster;
}

bool sm90_matmul_supports(const Sm90Matmul& m) {
  constexpr size_t kLimit = size_t(1) << 30;  // tile coordinates stay within int
  if (m.type != DataType::kBFloat16 && m.type != DataType::kFloat16) return false;
  if (m.rows == 0 || m.k == 0 || m.n == 0 || m.rows >= kLimit || m.k >= kLimit || m.n >= kLimit) return false;
  const size_t m_units = (m.rows + kCluster * kTileRows - 1) / (kCluster * kTileRows);
  const size_t units = m_units * ((m.n + kTileCols - 1) / kTileCols);
  if (units >= kLimit) return false;
  if (m.k % 8 != 0 || m.n % 8 != 0) return false;
  if (!aligned16(m.a) || !aligned16(m.b) || !aligned16(m.d) || (m.c != nullptr && !aligned16(m.c))) return false;
  return m.multiprocessors == 0 || m.multiprocessors >= kCluster;
}

cudaError_t launch_sm90_matmul(const Sm90Matmul& m, cudaStream_t stream) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const int resident = resident_blocks(device, m.type);
  if (resident < kCluster) return cudaErrorInvalidConfiguration;
  int blocks = m.multiprocessors == 0 ? resident : std::min(m.multiprocessors, resident);
  CUtensorMap map_a, map_b;
  if (!tensor_map(map_a, m.type, m.a, m.rows, m.k, kTileRows) ||
      !tensor_map(map_b, m.type, m.b, m.n, m.k, kTileCols / kCluster)) {
    return cudaErrorInvalidValue;
  }
  const int m_blocks = static_cast<int>((m.rows + kTileRows - 1) / kTileRows);
  const Schedule schedule{(m_blocks + kCluster - 1) / kCluster, static_cast<int>((m.n + kTileCols - 1) / kTileCols)};
  const long long units = static_cast<long long>(schedule.m_units) * schedule.n_blocks;
  blocks = static_cast<int>(std::min<long long>(blocks, units * kCluster)) / kCluster * kCluster;
  // C is not read where beta is 0 (as in cuBLASLt): a NaN there does not reach D.
  const bool reads_c = m.c != nullptr && m.beta != 0.0f;
  const Epilogue epilogue{m.d, reads_c ? m.c : nullptr, m.alpha, reads_c ? m.beta : 0.0f, static_cast<int>(m.rows),
                          static_cast<int>(m.n)};
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config = launch_config(blocks, stream, cluster);
  const int k = static_cast<int>(m.k);
  if (m.type == DataType::kBFloat16) {
    return cudaLaunchKernelEx(&config, matmul_sm90<__nv_bfloat16>, map_a, map_b, epilogue, schedule, k);
  }
  return cudaLaunchKernelEx(&config, matmul_sm90<__half>, map_a, map_b, epilogue, schedule, k);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE_FOR(9, 0)

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

#include "braid/device/sync_device.hpp"
#include "core/cuda_driver.hpp"
#include "core/kernel_modules.hpp"
#include "kernels/collective_id.hpp"
#include "sync/device_sync.hpp"

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
// Every barrier wait is bounded (kWaitLimitNs, then the kernel traps; with an exchange, the communicator's timeout
// more: a block's waits may stand behind its wait for a peer); the only waits on another GPU are an exchange's
// (NOTE [reduce-scatter in the epilogue], NOTE [all-gather under the loads]), bounded by the communicator's timeout.

// NOTE [reduce-scatter in the epilogue]
// With an exchange (Sm90Exchange), each rank computes every row of A x B^T and reduce-scatters the product by rows
// as it goes, in one launch, with no copy kernel, meeting or side stream:
//   - Order: the schedule runs over rows rotated by rank + 1 blocks, so a rank computes the blocks its peers own
//     first (rank + 1's first) and its own last: the peers' rows travel while its own still compute.
//   - Each consumer warpgroup has a staging buffer in shared memory (64 rows x 256 columns, in the TMA's 128-byte
//     swizzle; the kernel keeps 3 stages instead of 4 to make room), which it and a warp of the producer warpgroup,
//     the store warp, hand to each other once a tile (barriers to_store and to_consumer).
//   - A peer's tile: the consumers round their rows into the staging buffers and go on to their next tile; stores
//     across NVLink from their registers would hold the multiplications up. The store warp has the copy engine store
//     them (TMA tensor stores of 64 columns, through a tensor map of the peer's area: ExchangeMaps) into the peer's
//     exchange area, in its received block for this rank, waits until the stores are performed, fences at system
//     scope and stores the call's stamp into the peer's flags for the tile's two halves.
//   - An own tile: while the consumers still multiply, the store warp waits until every peer's flags for it hold the
//     stamp and has the copy engine load the first peer's rows into the staging buffers (TMA tensor loads of 64
//     columns); the consumers add any further peers' rows (read from the area) and those to their accumulators, in
//     float32 and in the accumulators' own layout, and store alpha x the sum to D as the plain GEMM stores.
//   - The store warp releases a peer tile's flags before it waits for any flag of the next tile, so no flag of one
//     rank waits for a flag of another.
//   - Stamps: the area's call count + 1, read by every block at its start. The last block to finish stores it back,
//     then writes it into every peer's freed word for this rank: "this rank has read what you sent, up to this call".
//     Before its first copy into a peer's area, the store warp waits for that peer's freed word to reach the previous
//     stamp, so a call never overwrites rows the peer's previous call still reads.
//   - Words only grow, so back-to-back calls and graph replays need no reset; an area is zeroed when made (on every
//     rank together, so their counts agree), and its flags never move while it lives.
// No wait depends on a block that may not be resident: a rank's own half-tiles wait for its peers' blocks only, and
// those wait only for the peers' previous launches. Every wait for a peer is bounded by the communicator's timeout
// and ends on a failure in its fatal word (device::spin_until: a timeout is recorded there, for the host to raise
// at the next call); a lane that gave up, and every lane of a launch that started on a stopped rank, stores nothing
// into a peer's area and releases no flag, and the last block then leaves the call count and freed words as they
// were (NOTE [stopped ranks]). verify/models/epilogue_exchange.pml checks the protocol.

// NOTE [all-gather under the loads]
// With an exchange of kind kAllGather, each rank multiplies the gathered A, every rank's block of rows, by B^T in
// one launch, as the rows arrive, with no copy kernel, meeting or side stream:
//   - Order: the schedule runs over rows rotated by rank blocks, so a rank multiplies its own block first (read
//     from its A where it is) while its peers' blocks travel.
//   - Sending: a warp of the producer warpgroup, the gather warp, copies this rank's rows into every peer's
//     exchange area (its received block for this rank) in pieces of 128 rows x kGatherPieceSteps steps of K: the
//     copy engine loads a box of 128 rows x 64 columns into one of two slots in shared memory and stores it to
//     every peer (TMA tensor copies through tensor maps of the peers' areas: ExchangeMaps), and into the gathered
//     A where one is asked for. Once a piece's stores are performed, it fences at system scope and stores the
//     call's stamp into each peer's flag for the piece. The pieces go round the blocks of the grid, so all of them
//     send at once.
//   - Loading: the producer, before the first step of a peer's piece in a tile, waits until its flag holds the
//     stamp, then has the copy engine load the step from the received block as it loads its own rows from A.
//   - The gathered A (where asked for): after their pieces, the gather warps wait for the peers' flags in turn and
//     copy the received pieces into it.
//   - Stamps and freed words as in the reduce-scatter: the last block to finish stores the stamp as the area's
//     call count and into every peer's freed word for this rank, and the gather warp waits for a peer's freed word
//     to reach the previous stamp before its first store into that peer's area.
// No wait depends on a block that may not be resident: the producers wait for the peers' gather warps, which wait
// only for the peers' previous launches; the waits are bounded and end on a failure as the reduce-scatter's do, and
// a producer that gave up loads on without waiting, so its consumers finish (NOTE [stopped ranks]).
// verify/models/loads_gather.pml checks the protocol.
// NOTE [reduce-scatter by the copy engines]
// With an exchange of kind kEngineReduceScatter, each rank computes every row of A x B^T in one launch of the plain
// kernel's shape (4 stages, no staging buffers), while the copy engines carry the peers' rows, driven from a stream
// of the caller's (kernels/matmul_sm90.hpp says what it enqueues):
//   - Order: as the epilogue reduce-scatter's, the blocks the peers own first (rank + 1's first), this rank's last.
//   - A peer's tile: the consumers store it as the plain GEMM does, unscaled and rounded, into this rank's products
//     for that peer (an area block), then each warp adds one to the ready count of the tile's chunk of rows.
//   - The gate (one thread on the caller's stream) waits until a chunk's count reaches one a warp and tile of the
//     chunk, then resets it; the copy engine then copies the chunk into the peer's received block for this rank,
//     and the post stores 1 into the peer's arrived flag for (this rank, chunk).
//   - An own tile: lane 0 of each warp waits until every peer's arrived flag for the tile's chunk is set; the warp
//     adds any further peers' rows (beyond 2 ranks) to its accumulators, then stores alpha x (product + the first
//     peer's rows, read as C) as the plain GEMM stores with C.
//   - The last block to finish resets this rank's arrived flags (every own tile has seen them) and advances the
//     call count and the peers' freed words as the other kinds do, so an epilogue or all-gather call after this
//     one waits for the peers to have read what this one sent.
// The copies into a peer's received block start only after a meeting of the ranks that every peer's previous call
// has ended (the caller's), so they never overwrite rows a previous call still reads; a chunk's count and flag
// return to 0 within the call, so back-to-back calls and graph replays need no reset. The gate and the own tiles'
// waits are bounded by the communicator's timeout and end on a failure (NOTE [stopped ranks]): a stopped rank posts
// no flag, and its last block leaves the words as they were.
constexpr int kTileRows = 128, kTileCols = 256, kTileK = 64;
constexpr int kStages = 4;
// With an exchange: one stage fewer, for a 64-row staging buffer per consumer warpgroup (NOTE [reduce-scatter in the
// epilogue]).
constexpr int kExchangeStages = 3;
constexpr uint32_t kStagingBytes = 64 * kTileCols * 2;
// An all-gather's piece: 128 rows of a rank's block by kGatherPieceSteps steps of K, a flag each (NOTE [all-gather
// under the loads]).
constexpr int kGatherPieceSteps = 8;
constexpr int kCluster = 2;
constexpr int kThreads = 3 * 128;
constexpr int kBandUnits = 8;
constexpr uint32_t kATileBytes = kTileRows * kTileK * 2, kBTileBytes = kTileCols * kTileK * 2;
constexpr uint32_t kStageBytes = kATileBytes + kBTileBytes;

// The kernel's instances: the plain GEMM, and one for each kind of exchange.
enum class Variant { kPlain, kReduceScatter, kAllGather, kEngineReduceScatter };
// The instances whose exchange goes through tensor maps of the peers' areas (ExchangeMaps).
__host__ __device__ constexpr bool maps_peers(Variant variant) {
  return variant == Variant::kReduceScatter || variant == Variant::kAllGather;
}
__host__ __device__ constexpr int stages_of(Variant variant) {
  return variant == Variant::kReduceScatter ? kExchangeStages : kStages;
}
// Stages, then the reduce-scatter's staging buffers or the all-gather's two slots of one box (an A tile), then
// barriers (full and empty a stage; the reduce-scatter's staged and drained a consumer, the all-gather's loaded a
// slot), and 1024 for alignment.
constexpr size_t shared_bytes(Variant variant) {
  const size_t stages = size_t(stages_of(variant)) * kStageBytes + 2 * stages_of(variant) * sizeof(uint64_t) + 1024;
  if (variant == Variant::kReduceScatter) return stages + 2 * kStagingBytes + 4 * sizeof(uint64_t);
  if (variant == Variant::kAllGather) return stages + 2 * kATileBytes + 2 * sizeof(uint64_t);
  return stages;
}
constexpr uint64_t kWaitLimitNs = 10'000'000'000ull;

struct Epilogue {
  void* d;
  const void* c;  // null: no C
  float alpha, beta;
  int rows, n;
};

// The exchange area's control words (NOTE [reduce-scatter in the epilogue]), and kEngineReduceScatter's counts and
// flags among them (NOTE [reduce-scatter by the copy engines]): a word each peer and chunk.
constexpr size_t kCallsOffset = 0, kBlocksDoneOffset = 8, kFreedOffset = 64;
constexpr size_t kEngineReadyOffset = 1024;
constexpr size_t kEngineArrivedOffset =
    kEngineReadyOffset + (kSm90ExchangeMaxWorld - 1) * kSm90EngineMaxChunks * sizeof(uint64_t);
static_assert(kEngineArrivedOffset + (kSm90ExchangeMaxWorld - 1) * kSm90EngineMaxChunks * sizeof(uint64_t) <=
                  kSm90ExchangeFlagsOffset,
              "kEngineReduceScatter's words fit among the control words");
static_assert(kFreedOffset + kSm90ExchangeMaxWorld * sizeof(uint64_t) <= kEngineReadyOffset,
              "the freed words end before kEngineReduceScatter's");
constexpr size_t kEngineChunkRows = 1024;

struct Schedule {
  int m_units, n_blocks;  // units: pairs of 128-row blocks of D by 256-column blocks
  int band_units = kBandUnits;  // rows of units a band (kEngineReduceScatter: a chunk's, so chunks end in order)
  // The first 128-row block and the column block of unit `u`.
  __device__ void unit(int u, int& m_block, int& n_block) const {
    const int per_band = band_units * n_blocks;
    const int band = u / per_band, in_band = u % per_band;
    const int first = band * band_units;
    const int height = min(band_units, m_units - first);
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

// Spins until `word` (written by `peer`) reaches `target` (words compared by their difference). False where the
// wait gave up: it timed out (recorded in the pad's fatal word) or a failure is recorded there; the rank is then
// stopped (NOTE [stopped ranks]).
__device__ __forceinline__ bool wait_for_word(const device::SignalPad& pad, const uint64_t* word, uint64_t target,
                                              Collective collective, unsigned int site, int peer) {
  return device::spin_until(pad, [&] { return device::reached(device::load_acquire_system(word), target); },
                            static_cast<unsigned int>(collective), site, peer, 0);
}

__device__ __forceinline__ void store_release_system(uint64_t* word, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
}

// The copy engine's views of the exchange areas' received blocks: [(world - 1) x block_rows, columns] from
// received_offset, in the 128-byte swizzle; a reduce-scatter's in boxes of 64 rows x 64 columns (the staging
// buffers' layout), an all-gather's in A's tiles.
struct ExchangeMaps {
  CUtensorMap received;                      // this rank's
  CUtensorMap peers[kSm90ExchangeMaxWorld];  // every peer's, mapped here (this rank's entry unused)
  CUtensorMap gathered;                      // an all-gather's gathered A, [world x block_rows, k] (if asked for)
};
struct NoExchangeMaps {};

// The kernel's view of an exchange (NOTE [reduce-scatter in the epilogue]); world 0: none.
struct ExchangeView {
  Sm90Exchange x;
  int m_blocks;     // 128-row blocks of A
  int shift;        // the rotation of the schedule's rows, in 128-row blocks
  int n_blocks;     // 256-column blocks of D
  size_t flags_per_peer;  // a reduce-scatter's 64-row half-tiles of a block, an all-gather's pieces of a block
  int pieces;       // an all-gather's pieces of a 128-row block (kGatherPieceSteps steps of K each)
  int chunk_rows;   // kEngineReduceScatter: the rows of a chunk (NOTE [reduce-scatter by the copy engines])

  // The 128-row block of A the schedule's block `logical` stands for.
  __device__ int rotate(int logical) const {
    return x.world == 0 || logical >= m_blocks ? logical : (logical + shift) % m_blocks;
  }
  __device__ uint64_t* control(uint8_t* area, size_t offset) const {
    return reinterpret_cast<uint64_t*>(area + offset);
  }
  // The freed word in `area` that rank q writes: the calls of q that have read what the area's rank sent it.
  __device__ uint64_t* freed(uint8_t* area, int q) const { return control(area, kFreedOffset + q * sizeof(uint64_t)); }
  // The flag `index` (a half-tile, or a piece) that the peer slot + 1 places after this rank (slot 0: rank + 1)
  // sends (slot_of).
  __device__ uint64_t* flag(uint8_t* area, int slot, size_t index) const {
    return reinterpret_cast<uint64_t*>(area + kSm90ExchangeFlagsOffset) + slot * flags_per_peer + index;
  }
  __device__ int slot_of(int sender, int receiver) const { return (sender - receiver - 1 + x.world) % x.world; }
  // kEngineReduceScatter's words in `area` (NOTE [reduce-scatter by the copy engines]): the ready count of this
  // rank's products for the peer destination + 1 places after it, and the arrived flag of the peer slot + 1 places
  // after it (slot_of), for chunk `chunk`.
  __device__ uint64_t* ready(uint8_t* area, int destination, int chunk) const {
    return control(area, kEngineReadyOffset + (destination * kSm90EngineMaxChunks + chunk) * sizeof(uint64_t));
  }
  __device__ uint64_t* arrived(uint8_t* area, int slot, int chunk) const {
    return control(area, kEngineArrivedOffset + (slot * kSm90EngineMaxChunks + chunk) * sizeof(uint64_t));
  }
  // The flag of consumer 0's half of the tile at `local_row0` (of its owner's block) and column block `n_block`;
  // consumer 1's is the next.
  __device__ size_t half(int local_row0, int n_block) const {
    return (size_t(local_row0 / kTileRows) * n_blocks + n_block) * 2 + (local_row0 % kTileRows) / 64;
  }
};

// How long the kernel's barrier waits may last before it traps: kWaitLimitNs, and with an exchange the
// communicator's timeout more, since any of them may stand behind a wait for a peer, which that timeout bounds.
__device__ __forceinline__ uint64_t wait_limit_ns(const ExchangeView& v) {
  if (v.x.world == 0) return kWaitLimitNs;
  const uint64_t timeout = v.x.pad.timeout_ns;
  return timeout > ~uint64_t(0) - kWaitLimitNs ? ~uint64_t(0) : timeout + kWaitLimitNs;
}

// Waits until `peer` has read what this rank sent it in its previous call (its freed word here reaches stamp - 1),
// before this rank stores into the peer's area; false where the wait gave up (NOTE [stopped ranks]).
__device__ __forceinline__ bool wait_freed(const ExchangeView& v, int peer, uint64_t stamp, Collective collective) {
  return wait_for_word(v.x.pad, v.freed(v.x.local, peer), stamp - 1, collective, kSiteExchangeFreed, peer);
}

// A staging buffer holds a warpgroup's 64 rows x 256 columns as the copy engine moves them: 4 boxes of 64 columns
// (kStagingBoxBytes each), each 64 rows of 128 bytes in the TMA's 128-byte swizzle (the 16-byte chunk c of row r at
// chunk c ^ (r % 8)), so that the lanes' accesses below spread over the banks.
constexpr int kStagingBoxCols = 64;
static_assert(kStagingBoxCols == kTileK, "a staging box is the tensor maps' box of 64 columns");
constexpr uint32_t kStagingBoxBytes = 64 * kStagingBoxCols * 2;
// The byte of the staging buffer where row `row`'s group `group` of 8 columns starts.
__device__ __forceinline__ uint32_t staged_group(int row, int group) {
  return (group / 8) * kStagingBoxBytes + row * 128 + (((group % 8) ^ (row % 8)) * 16);
}

// Rounds a consumer warpgroup's 64 rows into its staging buffer, each lane 16 bytes a row and group of 8 columns
// after the quad transpose, as store_tile's plain path stores them to D.
template <typename T>
__device__ __forceinline__ void stage_rows(const float (&acc)[128], uint8_t* staging, int tid) {
  const int lane = tid % 32;
  const int row = (tid / 32) * 16 + lane / 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int g = 0; g < 32; g += 4) {
      *reinterpret_cast<uint4*>(staging + staged_group(row + 8 * half, g + lane % 4)) = rounded_group<T>(acc, half, g, lane);
    }
  }
}

__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}

// Closes this thread's bulk group and waits until its copies have been performed.
__device__ __forceinline__ void bulk_stores_complete() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group 0;" ::: "memory");
}

// Adds the rows received from the peers beyond the first (slots 1 to world - 2, beyond 2 ranks) to a consumer
// warpgroup's accumulators of this rank's 64 rows from `local_row0` (of its block) and columns from `col0`, in the
// accumulators' own layout, each lane's column pairs read from the exchange area.
template <typename T>
__device__ __forceinline__ void add_further_peers(float (&acc)[128], const Sm90Exchange& x, int n, int local_row0,
                                                  int col0, int tid) {
  const int lane = tid % 32, row = (tid / 32) * 16 + lane / 4;
  const size_t block_elements = x.block_rows * size_t(n);
  const T* received = reinterpret_cast<const T*>(x.local + x.received_offset);
  for (int slot = 1; slot < x.world - 1; ++slot) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const T* source = received + slot * block_elements + size_t(local_row0 + row + 8 * half) * n;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = col0 + 8 * j + 2 * (lane % 4);
        if (col >= n) continue;
        const float2 more = Pack<T>::from(*reinterpret_cast<const uint32_t*>(source + col));
        acc[4 * j + 2 * half] += more.x;
        acc[4 * j + 2 * half + 1] += more.y;
      }
    }
  }
}

// A consumer warpgroup's 64 rows from `row0` (of A's rows) and columns from n_block * 256 of a tile this rank owns:
// alpha x (product + the received rows, added in float32) into D (NOTE [reduce-scatter in the epilogue]). The
// received rows are added in the accumulators' own layout, each lane's column pairs read from the exchange area
// (further peers', beyond 2 ranks) and then from the staging buffer (the first peer's), so the store is
// store_tile's plain path.
template <typename T>
__device__ __forceinline__ void store_own_rows(float (&acc)[128], const ExchangeView& v, const Epilogue& e, int row0,
                                               int n_block, const uint8_t* staging, int tid) {
  const Sm90Exchange& x = v.x;
  const int lane = tid % 32, row = (tid / 32) * 16 + lane / 4;
  const int local_row0 = row0 - x.rank * static_cast<int>(x.block_rows), col0 = n_block * kTileCols;
  add_further_peers<T>(acc, x, e.n, local_row0, col0, tid);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float2 c =
          Pack<T>::from(*reinterpret_cast<const uint32_t*>(staging + staged_group(row + 8 * half, j) + (lane % 4) * 4));
      acc[4 * j + 2 * half] = e.alpha * (acc[4 * j + 2 * half] + c.x);
      acc[4 * j + 2 * half + 1] = e.alpha * (acc[4 * j + 2 * half + 1] + c.y);
    }
  }
  const Epilogue out{e.d, nullptr, 1.0f, 0.0f, static_cast<int>(x.block_rows), e.n};
  store_tile<T>(acc, out, local_row0, col0, tid);
}

// A consumer warpgroup's 64 rows from `row0` (of A's rows) and columns from n_block * 256 with kEngineReduceScatter
// (NOTE [reduce-scatter by the copy engines]). A peer's rows: stored, unscaled, into this rank's products for that
// peer, then counted ready (a count a warp). This rank's own: once every peer's chunk has arrived, alpha x (product
// + the peers' rows) into D, the first peer's rows read as C. `stopped`: this lane gave the call up, or the rank was
// stopped when the launch started; it waits for nothing more.
template <typename T>
__device__ __forceinline__ void store_engine_rows(float (&acc)[128], const ExchangeView& v, const Epilogue& e,
                                                  int row0, int n_block, bool& stopped, int tid) {
  const Sm90Exchange& x = v.x;
  const int lane = tid % 32, block_rows = static_cast<int>(x.block_rows);
  const int owner = row0 / block_rows, local_row0 = row0 - owner * block_rows, col0 = n_block * kTileCols;
  const int chunk = local_row0 / v.chunk_rows;
  const size_t block_elements = x.block_rows * size_t(e.n);
  const T* received = reinterpret_cast<const T*>(x.local + x.received_offset);
  if (owner != x.rank) {
    const int destination = (owner - x.rank - 1 + x.world) % x.world;
    T* products = const_cast<T*>(received) + (size_t(x.world - 1) + destination) * block_elements;
    store_tile<T>(acc, Epilogue{products, nullptr, 1.0f, 0.0f, block_rows, e.n}, local_row0, col0, tid);
    __syncwarp();
    if (lane == 0) {
      __threadfence();  // the warp's stores before its count: the gate, then the copy engine, read them
      atomicAdd(reinterpret_cast<unsigned long long*>(v.ready(x.local, destination, chunk)), 1ull);
    }
    return;
  }
  if (lane == 0) {
    for (int slot = 0; slot < x.world - 1 && !stopped; ++slot) {
      const int sender = (x.rank + 1 + slot) % x.world;  // slot_of(sender, rank) == slot
      stopped = !wait_for_word(x.pad, v.arrived(x.local, slot, chunk), 1, Collective::kMatmulReduceScatter,
                               kSiteExchangeRows, sender);
    }
  }
  __syncwarp();
  add_further_peers<T>(acc, x, e.n, local_row0, col0, tid);
  store_tile<T>(acc, Epilogue{e.d, received, e.alpha, e.alpha, block_rows, e.n}, local_row0, col0, tid);
}

// The store warp (NOTE [reduce-scatter in the epilogue]). It takes the block's tiles in the consumers' order; at each,
// once both consumers have handed their staging buffers back:
//   1. the previous tile's, if a peer's: copies both staged halves into the peer's received block for this rank,
//      waits until the copies are performed, and releases the halves' flags in the peer's area;
//   2. this tile, if this rank's own: waits for every peer's flags for it, then has the copy engine load the first
//      peer's rows into the staging buffers, completing the consumers' barriers; if a peer's: hands the buffers
//      over as they are.
template <typename T>
__device__ __forceinline__ void exchange_tiles(const ExchangeView& v, const ExchangeMaps& maps, const Schedule& schedule,
                                               uint32_t block, int first_unit, int unit_step, uint8_t* staging,
                                               uint64_t* to_store, uint64_t* to_consumer, int n, uint64_t stamp,
                                               bool stopped, int lane) {
  const Sm90Exchange& x = v.x;
  const int block_rows = static_cast<int>(x.block_rows);
  const int units = schedule.m_units * schedule.n_blocks;
  // stopped: this lane gave the call up, or the rank was stopped when the launch started: it stores nothing into
  // a peer's area and waits for nothing, but still hands the buffers back (NOTE [stopped ranks]).
  uint64_t cleared = 0;  // the peers whose freed word this lane has seen
  uint32_t handoffs = 0;
  int sent_owner = -1, sent_row0 = 0, sent_n_block = 0;  // the previous tile, where a peer's
  auto send_previous = [&] {
    const int owner = sent_owner, slot = v.slot_of(x.rank, owner);
    uint8_t* peer = x.peers[owner];
    if (lane < 2 && !stopped && !((cleared >> owner) & 1)) {
      stopped = !wait_freed(v, owner, stamp, Collective::kMatmulReduceScatter);
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's stores after the acquire
      cleared |= uint64_t(1) << owner;
    }
    if (lane < 2 && !stopped) {  // lane h: half h; columns past n are not stored
      for (int box = 0; box < kTileCols / kStagingBoxCols; ++box) {
        const int col = sent_n_block * kTileCols + box * kStagingBoxCols;
        if (col < n) {
          tma_store(&maps.peers[owner], col, slot * block_rows + sent_row0 + 64 * lane,
                    staging + lane * kStagingBytes + box * kStagingBoxBytes);
        }
      }
      bulk_stores_complete();
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's stores before the flag
      __threadfence_system();
      store_release_system(v.flag(peer, slot, v.half(sent_row0, sent_n_block) + lane), stamp);
    }
    __syncwarp();
    sent_owner = -1;
  };
  const auto wait_limit = [&] { return wait_limit_ns(v); };
  auto buffers_back = [&] {  // both consumers have handed their buffers back after their previous tile
    barrier_wait(&to_store[0], (handoffs & 1) ^ 1, wait_limit);
    barrier_wait(&to_store[1], (handoffs & 1) ^ 1, wait_limit);
  };
  for (int u = first_unit; u < units; u += unit_step) {
    int m_block, n_block;
    schedule.unit(u, m_block, n_block);
    m_block = v.rotate(m_block + block);
    if (m_block >= v.m_blocks) continue;  // the second block of a cluster past the last row: the consumers skip it
    buffers_back();
    if (sent_owner >= 0) send_previous();
    const int row0 = m_block * kTileRows, owner = row0 / block_rows, local_row0 = row0 - owner * block_rows;
    if (owner == x.rank) {
      const size_t half = v.half(local_row0, n_block);
      for (int slot = 0; lane < 2 && !stopped && slot < x.world - 1; ++slot) {
        const int sender = (x.rank + slot + 1) % x.world;  // slot_of(sender, rank) == slot
        stopped = !wait_for_word(x.pad, v.flag(x.local, slot, half + lane), stamp, Collective::kMatmulReduceScatter,
                                 kSiteExchangeRows, sender);
      }
      if (lane < 2 && stopped) {
        barrier_arrive(&to_consumer[lane]);  // the consumer adds whatever the buffer holds: the call is given up
      } else if (lane < 2) {  // lane h: half h, whose flags it waited for itself; columns past n arrive as zeros
        asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's load after the acquire
        barrier_expect_bytes(&to_consumer[lane], kStagingBytes);
        for (int box = 0; box < kTileCols / kStagingBoxCols; ++box) {  // a box past n arrives as zeros
          tma_load(staging + lane * kStagingBytes + box * kStagingBoxBytes, &maps.received,
                   n_block * kTileCols + box * kStagingBoxCols, local_row0 + 64 * lane, &to_consumer[lane]);
        }
      }
    } else {
      if (lane == 0) {
        barrier_arrive(&to_consumer[0]);
        barrier_arrive(&to_consumer[1]);
      }
      sent_owner = owner;
      sent_row0 = local_row0;
      sent_n_block = n_block;
    }
    ++handoffs;
  }
  buffers_back();
  if (sent_owner >= 0) send_previous();
}

// After every block's tiles: the last block to finish stores the stamp as the area's call count and into every
// peer's freed word for this rank, unless the rank is stopped (NOTE [stopped ranks]: it posts nothing more).
// ResetsArrived (kEngineReduceScatter): the last block first resets this rank's arrived flags (NOTE [reduce-scatter
// by the copy engines]).
template <bool ResetsArrived>
__device__ __forceinline__ void finish_exchange(const ExchangeView& v, uint64_t stamp) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  const Sm90Exchange& x = v.x;
  unsigned int* blocks_done = reinterpret_cast<unsigned int*>(x.local + kBlocksDoneOffset);
  __threadfence();
  if (atomicAdd(blocks_done, 1u) != gridDim.x - 1) return;
  *blocks_done = 0;
  if (device::rank_stopped(x.pad)) return;
  if constexpr (ResetsArrived) {
    const int chunks = static_cast<int>((x.block_rows + v.chunk_rows - 1) / v.chunk_rows);
    for (int slot = 0; slot < x.world - 1; ++slot) {
      for (int chunk = 0; chunk < chunks; ++chunk) *v.arrived(x.local, slot, chunk) = 0;
    }
  }
  *v.control(x.local, kCallsOffset) = stamp;
  __threadfence_system();
  for (int peer = 0; peer < x.world; ++peer) {
    if (peer != x.rank) store_release_system(v.freed(x.peers[peer], x.rank), stamp);
  }
}

// The gather warp of an all-gather (NOTE [all-gather under the loads]); lane 0 works. Its block takes every
// gridDim.x-th item: first the pieces of this rank's block, which it sends to every peer (and into the gathered A),
// then, where a gathered A is asked for, the pieces received from the peers, which it copies there.
__device__ __forceinline__ void gather_rows(const ExchangeView& v, const ExchangeMaps& maps, const CUtensorMap* shard,
                                            uint8_t* slots, uint64_t* loaded, int k_steps, uint64_t stamp,
                                            bool stopped, int lane) {
  if (lane != 0) return;
  const Sm90Exchange& x = v.x;
  const int block_rows = static_cast<int>(x.block_rows);
  const int sends = block_rows / kTileRows * v.pieces;
  const int items = x.gathered == nullptr ? sends : x.world * sends;
  uint32_t uses = 0;  // boxes through the slots so far
  // A box into the next slot from `from` at (col, row), then `store` of the slot as one bulk group. The slot's
  // previous stores, two boxes back, must have read it first.
  auto copy_box = [&](const CUtensorMap* from, int col, int row, auto&& store) {
    const uint32_t s = uses % 2;
    uint8_t* slot = slots + s * kATileBytes;
    if (uses >= 2) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    barrier_expect_bytes(&loaded[s], kATileBytes);
    tma_load(slot, from, col, row, &loaded[s]);
    barrier_wait(&loaded[s], (uses / 2) & 1, [&] { return wait_limit_ns(v); });
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    store(slot);
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    ++uses;
  };
  uint64_t cleared = 0;  // the peers whose freed word this lane has seen
  for (int item = blockIdx.x; item < items && !stopped; item += gridDim.x) {
    const int source = item / sends, index = item % sends;  // source 0: this rank's block; s: received slot s - 1
    const int row = index / v.pieces * kTileRows, piece = index % v.pieces;
    const int first_box = piece * kGatherPieceSteps, last_box = min(k_steps, first_box + kGatherPieceSteps);
    if (source == 0) {
      for (int i = 1; i < x.world && !stopped; ++i) {
        const int peer = (x.rank + i) % x.world;
        if ((cleared >> peer) & 1) continue;
        stopped = !wait_freed(v, peer, stamp, Collective::kAllGatherMatmul);
        cleared |= uint64_t(1) << peer;
      }
      if (stopped) break;
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's stores after the acquires
      for (int box = first_box; box < last_box; ++box) {
        copy_box(shard, box * kTileK, row, [&](const uint8_t* slot) {
          for (int i = 1; i < x.world; ++i) {
            const int peer = (x.rank + i) % x.world;
            tma_store(&maps.peers[peer], box * kTileK, v.slot_of(x.rank, peer) * block_rows + row, slot);
          }
          if (x.gathered != nullptr) tma_store(&maps.gathered, box * kTileK, x.rank * block_rows + row, slot);
        });
      }
      bulk_stores_complete();
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's stores before the flags
      __threadfence_system();
      for (int i = 1; i < x.world; ++i) {
        const int peer = (x.rank + i) % x.world;
        store_release_system(v.flag(x.peers[peer], v.slot_of(x.rank, peer), index), stamp);
      }
    } else {
      const int slot = source - 1, sender = (x.rank + slot + 1) % x.world;  // slot_of(sender, rank) == slot
      stopped = !wait_for_word(x.pad, v.flag(x.local, slot, index), stamp, Collective::kAllGatherMatmul,
                               kSiteGatheredRows, sender);
      if (stopped) break;
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's loads after the acquire
      for (int box = first_box; box < last_box; ++box) {
        copy_box(&maps.received, box * kTileK, slot * block_rows + row, [&](const uint8_t* slot_bytes) {
          tma_store(&maps.gathered, box * kTileK, sender * block_rows + row, slot_bytes);
        });
      }
    }
  }
  bulk_stores_complete();  // every store performed (and the slots read) before the block ends
}

// Each variant a kernel of its own, so that the plain GEMM's code stays as it is.
template <typename T, Variant V>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_sm90(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b, Epilogue epilogue,
                Schedule schedule, int k, ExchangeView exchange,
                const __grid_constant__ std::conditional_t<maps_peers(V), ExchangeMaps, NoExchangeMaps> maps) {
  constexpr bool Exchanged = V != Variant::kPlain;
  constexpr bool ReduceScatter = V == Variant::kReduceScatter, AllGather = V == Variant::kAllGather;
  constexpr bool EngineReduceScatter = V == Variant::kEngineReduceScatter;
  constexpr int Stages = stages_of(V);
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* a_tiles = shared;
  uint8_t* b_tiles = shared + Stages * kATileBytes;
  // The reduce-scatter's staging buffers for the consumers, the all-gather's slots for the gather warp.
  uint8_t* staging = shared + Stages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + (ReduceScatter ? 2 * kStagingBytes
                                                          : AllGather   ? 2 * kATileBytes
                                                                        : 0));
  uint64_t* empty = full + Stages;
  uint64_t* to_store = empty + Stages;  // ReduceScatter: a consumer hands its staging buffer to the store warp
  uint64_t* to_consumer = to_store + 2;  // ReduceScatter: ... and the store warp hands it back
  uint64_t* loaded = empty + Stages;     // AllGather: a slot's box has landed
  const int group = threadIdx.x / 128, tid = threadIdx.x % 128;
  const uint32_t block = cluster_block();
  __shared__ uint64_t stamp;  // the exchange's call (NOTE [reduce-scatter in the epilogue]); unused without
  __shared__ int stopped_at_start;  // the exchange's rank was stopped (NOTE [stopped ranks]); unused without
  if (threadIdx.x == 0) {
    if (Exchanged) {
      stamp = *exchange.control(exchange.x.local, kCallsOffset) + 1;
      stopped_at_start = device::rank_stopped(exchange.x.pad);
    }
    for (int s = 0; s < Stages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], 2 * kCluster);
    }
    if (ReduceScatter) {
      for (int c = 0; c < 2; ++c) {
        barrier_init(&to_store[c], 128);
        barrier_init(&to_consumer[c], 1);
      }
    }
    if (AllGather) {
      barrier_init(&loaded[0], 1);
      barrier_init(&loaded[1], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();
  const int units = schedule.m_units * schedule.n_blocks;
  const int first_unit = blockIdx.x / kCluster, unit_step = gridDim.x / kCluster;
  const int k_steps = (k + kTileK - 1) / kTileK;
  const auto wait_limit = [&] { return wait_limit_ns(exchange); };  // read by a wait only once it has lasted
  if (group == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      int stage = 0;
      uint32_t phase = 0;
      // AllGather: the rank is stopped, or a wait gave up: load on without waiting (NOTE [stopped ranks]).
      [[maybe_unused]] bool stopped = Exchanged && stopped_at_start != 0;
      for (int u = first_unit; u < units; u += unit_step) {
        int m_block, n_block;
        schedule.unit(u, m_block, n_block);
        m_block += block;
        if (Exchanged) m_block = exchange.rotate(m_block);
        // Where A's rows come from: A itself, or (AllGather) this rank's block of A or the received block of a
        // peer's rows, whose pieces' flags the steps wait for (NOTE [all-gather under the loads]).
        const CUtensorMap* a_map = &map_a;
        int a_row = m_block * kTileRows, sender = -1, slot = 0, piece_of_block = 0;
        if constexpr (AllGather) {
          const int block_rows = static_cast<int>(exchange.x.block_rows);
          const int owner = m_block < exchange.m_blocks ? a_row / block_rows : exchange.x.rank;
          a_row = a_row - owner * block_rows;  // past this rank's block (zeros) for a row block past the last
          if (owner != exchange.x.rank) {
            sender = owner;
            slot = exchange.slot_of(owner, exchange.x.rank);
            piece_of_block = a_row / kTileRows * exchange.pieces;
            a_map = &maps.received;
            a_row += slot * block_rows;
          }
        }
        for (int step = 0; step < k_steps; ++step) {
          if constexpr (AllGather) {
            if (sender >= 0 && !stopped && step % kGatherPieceSteps == 0) {
              stopped = !wait_for_word(exchange.x.pad,
                                       exchange.flag(exchange.x.local, slot, piece_of_block + step / kGatherPieceSteps),
                                       stamp, Collective::kAllGatherMatmul, kSiteGatheredRows, sender);
              asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's loads after the acquire
            }
          }
          barrier_wait(&empty[stage], phase ^ 1, wait_limit);
          barrier_expect_bytes(&full[stage], kStageBytes);
          tma_load(a_tiles + stage * kATileBytes, a_map, step * kTileK, a_row, &full[stage]);
          constexpr int part = kTileCols / kCluster;
          tma_load_multicast(b_tiles + stage * kBTileBytes + block * part * kTileK * 2, &map_b, step * kTileK,
                             n_block * kTileCols + block * part, &full[stage]);
          if (++stage == Stages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    } else if (Exchanged && tid / 32 == 1) {
      if constexpr (ReduceScatter) {
        exchange_tiles<T>(exchange, maps, schedule, block, first_unit, unit_step, staging, to_store, to_consumer,
                          epilogue.n, stamp, stopped_at_start != 0, tid % 32);
      } else if constexpr (AllGather) {
        gather_rows(exchange, maps, &map_a, staging, loaded, k_steps, stamp, stopped_at_start != 0, tid % 32);
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int consumer = group - 1;
    // Warp w's lane 0 releases stages to block w of the cluster.
    const bool releases = tid % 32 == 0 && tid / 32 < kCluster;
    float acc[128];
    uint32_t handoffs = 0;  // ReduceScatter: the store warp's handoffs of this warpgroup's staging buffer
    // EngineReduceScatter: this lane waits for nothing more (NOTE [stopped ranks]).
    [[maybe_unused]] bool stopped = EngineReduceScatter && stopped_at_start != 0;
    int stage = 0;
    uint32_t phase = 0;
    for (int u = first_unit; u < units; u += unit_step) {
      int m_block, n_block;
      schedule.unit(u, m_block, n_block);
      m_block += block;
      if (Exchanged) m_block = exchange.rotate(m_block);
      int previous = -1;
      for (int step = 0; step < k_steps; ++step) {
        barrier_wait(&full[stage], phase, wait_limit);
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
        if (++stage == Stages) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      if (releases) barrier_arrive_in(&empty[previous], tid / 32);
      const int row0 = m_block * kTileRows + consumer * 64;
      if constexpr (EngineReduceScatter) {
        if (m_block < exchange.m_blocks) store_engine_rows<T>(acc, exchange, epilogue, row0, n_block, stopped, tid);
      } else if constexpr (!ReduceScatter) {
        store_tile<T>(acc, epilogue, row0, n_block * kTileCols, tid);
      } else if (m_block >= exchange.m_blocks) {
        continue;  // the second block of a cluster past the last row
      } else {
        uint8_t* buffer = staging + consumer * kStagingBytes;
        barrier_wait(&to_consumer[consumer], handoffs++ & 1, wait_limit);
        if (row0 / static_cast<int>(exchange.x.block_rows) == exchange.x.rank) {
          store_own_rows<T>(acc, exchange, epilogue, row0, n_block, buffer, tid);
        } else {  // a peer's: into the staging buffer, for the store warp
          stage_rows<T>(acc, buffer, tid);
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copy engine reads what the lanes wrote
        }
        barrier_arrive(&to_store[consumer]);
      }
    }
  }
  cluster_sync();  // no block leaves while the other may still multicast into it or release its stages
  if constexpr (Exchanged) finish_exchange<EngineReduceScatter>(exchange, stamp);
}

cudaLaunchConfig_t launch_config(int blocks, Variant variant, cudaStream_t stream, cudaLaunchAttribute& cluster) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared_bytes(variant);
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

template <typename T>
const void* kernel_of(Variant variant) {
  switch (variant) {
    case Variant::kPlain: return reinterpret_cast<const void*>(&matmul_sm90<T, Variant::kPlain>);
    case Variant::kReduceScatter: return reinterpret_cast<const void*>(&matmul_sm90<T, Variant::kReduceScatter>);
    case Variant::kAllGather: return reinterpret_cast<const void*>(&matmul_sm90<T, Variant::kAllGather>);
    case Variant::kEngineReduceScatter:
      return reinterpret_cast<const void*>(&matmul_sm90<T, Variant::kEngineReduceScatter>);
  }
  return nullptr;
}

const void* kernel_of(DataType type, Variant variant) {
  return type == DataType::kBFloat16 ? kernel_of<__nv_bfloat16>(variant) : kernel_of<__half>(variant);
}

Variant variant_of(Sm90ExchangeKind kind) {
  switch (kind) {
    case Sm90ExchangeKind::kAllGather: return Variant::kAllGather;
    case Sm90ExchangeKind::kEngineReduceScatter: return Variant::kEngineReduceScatter;
    case Sm90ExchangeKind::kReduceScatter: break;
  }
  return Variant::kReduceScatter;
}

Variant variant_of(const Sm90Exchange& x) { return x.world == 0 ? Variant::kPlain : variant_of(x.kind); }

// The most blocks of the kernel's `variant` for `type` that run at once on `device` (whole clusters), its
// shared-memory limit raised on first use; 0 where that fails.
int resident_blocks(int device, DataType type, Variant variant) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, static_cast<int>(type), static_cast<int>(variant));
  if (const auto found = known.find(key); found != known.end()) return found->second;
  const void* kernel = kernel_of(type, variant);
  int clusters = 0;
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config = launch_config(kCluster, variant, nullptr, cluster);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(shared_bytes(variant))) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    clusters = 0;
  }
  known[key] = clusters * kCluster;
  return clusters * kCluster;
}

// A row-major [rows, k] matrix at `base` in boxes of 64 columns x box_rows rows, in the 128-byte swizzle.
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

// The bytes of an element of the kernel's datatypes (bf16, fp16); 0 for any other.
size_t element_bytes(DataType type) { return type == DataType::kFloat16 || type == DataType::kBFloat16 ? 2 : 0; }

// kEngineReduceScatter's gate and post (NOTE [reduce-scatter by the copy engines]); one thread each.
__global__ void engine_gate(device::SignalPad pad, uint64_t* ready, uint64_t target, int rank) {
  if (device::rank_stopped(pad)) return;
  const bool came = device::spin_until(
      pad, [&] { return device::load_acquire_system(ready) >= target; },
      static_cast<unsigned int>(Collective::kMatmulReduceScatter), kSiteProductRows, rank, 0);  // its own GEMM
  if (came) *ready = 0;  // every count of this call is in: the next call counts from 0
}

__global__ void engine_post(device::SignalPad pad, uint64_t* arrived) {
  if (device::rank_stopped(pad) || device::failure_recorded(pad)) return;
  __threadfence_system();
  store_release_system(arrived, 1);
}

}  // namespace

bool sm90_matmul_available(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  if (major != 9 || minor != 0 || driver().cuTensorMapEncodeTiled == nullptr) return false;
  for (const DataType type : {DataType::kBFloat16, DataType::kFloat16}) {
    for (const Variant variant :
         {Variant::kPlain, Variant::kReduceScatter, Variant::kAllGather, Variant::kEngineReduceScatter}) {
      if (resident_blocks(device, type, variant) < kCluster) return false;
    }
  }
  return true;
}

int sm90_exchange_resident_blocks(int device, DataType type, Sm90ExchangeKind kind) {
  return resident_blocks(device, type, variant_of(kind));
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
  if (m.multiprocessors != 0 && m.multiprocessors < kCluster) return false;
  const Sm90Exchange& x = m.exchange;
  if (x.world == 0) return true;
  const bool all_gather = x.kind == Sm90ExchangeKind::kAllGather;
  const bool engines = x.kind == Sm90ExchangeKind::kEngineReduceScatter;
  if (x.kind != Sm90ExchangeKind::kReduceScatter && !all_gather && !engines) return false;
  if (engines && x.block_rows != 0 && sm90_engine_chunks(x.block_rows) > kSm90EngineMaxChunks) return false;
  const size_t columns = all_gather ? m.k : m.n;
  return x.world >= 2 && x.world <= kSm90ExchangeMaxWorld && x.rank >= 0 && x.rank < x.world && m.c == nullptr &&
         x.block_rows != 0 && x.block_rows % kTileRows == 0 && m.rows / x.world == x.block_rows &&
         m.rows % x.world == 0 && x.local != nullptr && x.peers != nullptr && x.host_peers != nullptr &&
         x.received_offset >=
             kSm90ExchangeFlagsOffset + sm90_exchange_flag_bytes(x.kind, x.world, x.block_rows, columns) &&
         x.received_offset % 16 == 0 && x.pad.error != nullptr &&
         (x.gathered == nullptr || (all_gather && aligned16(x.gathered)));
}

size_t sm90_exchange_flag_bytes(Sm90ExchangeKind kind, int world, size_t block_rows, size_t columns) {
  if (kind == Sm90ExchangeKind::kEngineReduceScatter) return 0;  // its words are control words
  const size_t row_blocks = (block_rows + kTileRows - 1) / kTileRows;
  const size_t steps = (columns + kTileK - 1) / kTileK;
  const size_t per_block = kind == Sm90ExchangeKind::kAllGather
                               ? (steps + kGatherPieceSteps - 1) / kGatherPieceSteps  // pieces of K
                               : (columns + kTileCols - 1) / kTileCols * 2;         // 64-row half-tiles
  return size_t(std::max(world - 1, 0)) * row_blocks * per_block * sizeof(uint64_t);
}

size_t sm90_exchange_bytes(Sm90ExchangeKind kind, int world, size_t block_rows, size_t columns, DataType type,
                           size_t flag_capacity) {
  const size_t element = element_bytes(type);
  const size_t blocks = size_t(std::max(world - 1, 0)) * (kind == Sm90ExchangeKind::kEngineReduceScatter ? 2 : 1);
  return kSm90ExchangeFlagsOffset + flag_capacity + blocks * block_rows * columns * element;
}

size_t sm90_engine_chunk_rows(size_t block_rows) {
  // kEngineChunkRows, or more where a block would otherwise need more than kSm90EngineMaxChunks; whole 128-row blocks.
  const size_t fewest = (block_rows + kSm90EngineMaxChunks - 1) / kSm90EngineMaxChunks;
  const size_t rows = std::max(kEngineChunkRows, (fewest + kTileRows - 1) / kTileRows * kTileRows);
  return std::min(rows, std::max(block_rows, size_t(1)));
}

size_t sm90_engine_chunks(size_t block_rows) {
  if (block_rows == 0) return 0;
  const size_t rows = sm90_engine_chunk_rows(block_rows);
  return (block_rows + rows - 1) / rows;
}

size_t sm90_engine_ready_offset(int destination, size_t chunk) {
  return kEngineReadyOffset + (size_t(destination) * kSm90EngineMaxChunks + chunk) * sizeof(uint64_t);
}

size_t sm90_engine_arrived_offset(int slot, size_t chunk) {
  return kEngineArrivedOffset + (size_t(slot) * kSm90EngineMaxChunks + chunk) * sizeof(uint64_t);
}

size_t sm90_engine_partials_offset(const Sm90Exchange& x, size_t columns, DataType type, int destination) {
  const size_t element = element_bytes(type);
  const size_t block_bytes = x.block_rows * columns * element;
  return x.received_offset + (size_t(x.world - 1) + size_t(destination)) * block_bytes;
}

cudaError_t launch_sm90_engine_gate(const Sm90Exchange& x, int destination, size_t chunk, uint32_t target,
                                    cudaStream_t stream) {
  auto* ready = reinterpret_cast<uint64_t*>(x.local + sm90_engine_ready_offset(destination, chunk));
  engine_gate<<<1, 1, 0, stream>>>(x.pad, ready, target, x.rank);
  return cudaGetLastError();
}

cudaError_t launch_sm90_engine_post(const Sm90Exchange& x, int peer, int slot, size_t chunk, cudaStream_t stream) {
  auto* arrived = reinterpret_cast<uint64_t*>(x.host_peers[peer] + sm90_engine_arrived_offset(slot, chunk));
  engine_post<<<1, 1, 0, stream>>>(x.pad, arrived);
  return cudaGetLastError();
}

uint32_t sm90_engine_ready_target(size_t chunk_rows, size_t columns) {
  // Each 128-row tile of the chunk's rows by 256 columns: 2 consumer warpgroups of 4 warps.
  return static_cast<uint32_t>((chunk_rows + kTileRows - 1) / kTileRows * ((columns + kTileCols - 1) / kTileCols) * 8);
}

cudaError_t launch_sm90_matmul(const Sm90Matmul& m, cudaStream_t stream) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const Sm90Exchange& x = m.exchange;
  const Variant variant = variant_of(x);
  const int resident = resident_blocks(device, m.type, variant);
  if (resident < kCluster) return cudaErrorInvalidConfiguration;
  int blocks = m.multiprocessors == 0 ? resident : std::min(m.multiprocessors, resident);
  // An all-gather's A is this rank's block; its peers' blocks come through the exchange (ExchangeMaps).
  const size_t a_rows = variant == Variant::kAllGather ? x.block_rows : m.rows;
  CUtensorMap map_a, map_b;
  if (!tensor_map(map_a, m.type, m.a, a_rows, m.k, kTileRows) ||
      !tensor_map(map_b, m.type, m.b, m.n, m.k, kTileCols / kCluster)) {
    return cudaErrorInvalidValue;
  }
  const int m_blocks = static_cast<int>((m.rows + kTileRows - 1) / kTileRows);
  Schedule schedule{(m_blocks + kCluster - 1) / kCluster, static_cast<int>((m.n + kTileCols - 1) / kTileCols)};
  const size_t chunk_rows = variant == Variant::kEngineReduceScatter ? sm90_engine_chunk_rows(x.block_rows) : 0;
  if (chunk_rows != 0) schedule.band_units = static_cast<int>(std::max<size_t>(1, chunk_rows / (kCluster * kTileRows)));
  const long long units = static_cast<long long>(schedule.m_units) * schedule.n_blocks;
  blocks = static_cast<int>(std::min<long long>(blocks, units * kCluster)) / kCluster * kCluster;
  // C is not read where beta is 0 (as in cuBLASLt): a NaN there does not reach D.
  const bool reads_c = m.c != nullptr && m.beta != 0.0f;
  const Epilogue epilogue{m.d, reads_c ? m.c : nullptr, m.alpha, reads_c ? m.beta : 0.0f, static_cast<int>(m.rows),
                          static_cast<int>(m.n)};
  ExchangeView exchange{x, m_blocks, 0, schedule.n_blocks, 0, 0, static_cast<int>(chunk_rows)};
  const int k = static_cast<int>(m.k);
  const int per_rank = static_cast<int>(x.block_rows / kTileRows);
  if (variant == Variant::kReduceScatter || variant == Variant::kEngineReduceScatter) {  // peers' first, rank + 1's
    exchange.shift = (x.rank + 1) % x.world * per_rank;
    exchange.flags_per_peer = size_t(per_rank) * schedule.n_blocks * 2;
  } else if (variant == Variant::kAllGather) {  // this rank's block first
    exchange.shift = x.rank * per_rank;
    exchange.pieces = ((k + kTileK - 1) / kTileK + kGatherPieceSteps - 1) / kGatherPieceSteps;
    exchange.flags_per_peer = size_t(per_rank) * exchange.pieces;
  }
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config = launch_config(blocks, variant, stream, cluster);
  if (variant == Variant::kPlain) {
    return m.type == DataType::kBFloat16
               ? cudaLaunchKernelEx(&config, matmul_sm90<__nv_bfloat16, Variant::kPlain>, map_a, map_b, epilogue,
                                    schedule, k, exchange, NoExchangeMaps{})
               : cudaLaunchKernelEx(&config, matmul_sm90<__half, Variant::kPlain>, map_a, map_b, epilogue, schedule, k,
                                    exchange, NoExchangeMaps{});
  }
  if (variant == Variant::kEngineReduceScatter) {
    return m.type == DataType::kBFloat16
               ? cudaLaunchKernelEx(&config, matmul_sm90<__nv_bfloat16, Variant::kEngineReduceScatter>, map_a, map_b,
                                    epilogue, schedule, k, exchange, NoExchangeMaps{})
               : cudaLaunchKernelEx(&config, matmul_sm90<__half, Variant::kEngineReduceScatter>, map_a, map_b,
                                    epilogue, schedule, k, exchange, NoExchangeMaps{});
  }
  ExchangeMaps maps{};
  bool mapped = true;
  // The received blocks: a reduce-scatter's rows of D in the staging buffers' boxes, an all-gather's rows of A in
  // A's tiles.
  const bool reduce_scatter = variant == Variant::kReduceScatter;
  auto map_received = [&](CUtensorMap& map, const uint8_t* area) {
    return tensor_map(map, m.type, area + x.received_offset, x.block_rows * (x.world - 1), reduce_scatter ? m.n : m.k,
                      reduce_scatter ? 64 : kTileRows);
  };
  mapped = map_received(maps.received, x.local);
  for (int peer = 0; peer < x.world; ++peer) {
    if (peer != x.rank) mapped = mapped && map_received(maps.peers[peer], x.host_peers[peer]);
  }
  if (x.gathered != nullptr) mapped = mapped && tensor_map(maps.gathered, m.type, x.gathered, m.rows, m.k, kTileRows);
  if (!mapped) return cudaErrorInvalidValue;
  if (variant == Variant::kReduceScatter) {
    return m.type == DataType::kBFloat16
               ? cudaLaunchKernelEx(&config, matmul_sm90<__nv_bfloat16, Variant::kReduceScatter>, map_a, map_b,
                                    epilogue, schedule, k, exchange, maps)
               : cudaLaunchKernelEx(&config, matmul_sm90<__half, Variant::kReduceScatter>, map_a, map_b, epilogue,
                                    schedule, k, exchange, maps);
  }
  return m.type == DataType::kBFloat16
             ? cudaLaunchKernelEx(&config, matmul_sm90<__nv_bfloat16, Variant::kAllGather>, map_a, map_b, epilogue,
                                  schedule, k, exchange, maps)
             : cudaLaunchKernelEx(&config, matmul_sm90<__half, Variant::kAllGather>, map_a, map_b, epilogue, schedule,
                                  k, exchange, maps);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE_FOR(9, 0)

// braid's Hopper GEMM (matmul_sm90.hpp): the kernel and its host side (availability, resident blocks, tensor maps,
// launches). Built for sm_90a alone (src/CMakeLists.txt): wgmma and setmaxnreg exist only there. Its pieces, included
// by this file alone: its shape (matmul_sm90_shape.cuh), its primitives (matmul_sm90_pipeline.cuh), its epilogue
// (matmul_sm90_epilogue.cuh), and its exchanges (matmul_sm90_exchange.cuh, with a header for each kind:
// matmul_sm90_epilogue_exchange.cuh, matmul_sm90_loads_gather.cuh, matmul_sm90_engine_exchange.cuh). The exchange
// area's layout on the host is in matmul_sm90_layout.cpp.
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
#include "kernels/matmul_sm90_engine_exchange.cuh"
#include "kernels/matmul_sm90_epilogue.cuh"
#include "kernels/matmul_sm90_epilogue_exchange.cuh"
#include "kernels/matmul_sm90_exchange.cuh"
#include "kernels/matmul_sm90_layout.hpp"
#include "kernels/matmul_sm90_loads_gather.cuh"
#include "kernels/matmul_sm90_pipeline.cuh"
#include "kernels/matmul_sm90_shape.cuh"
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
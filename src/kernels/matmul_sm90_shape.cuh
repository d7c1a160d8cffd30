// braid's Hopper GEMM (matmul_sm90.cu), its shape: the stages and shared memory of each of the kernel's instances
// (Variant), and the schedule of its units over the thread blocks (NOTE [Hopper GEMM]). Included by matmul_sm90.cu
// alone, whose anonymous namespace its pieces join.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_sm90_layout.hpp"

namespace braid::kernels {
namespace {

constexpr int kStages = 4;
// With an exchange: one stage fewer, for a 64-row staging buffer per consumer warpgroup (NOTE [reduce-scatter in the
// epilogue]).
constexpr int kExchangeStages = 3;
constexpr uint32_t kStagingBytes = 64 * kTileCols * 2;
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

}  // namespace
}  // namespace braid::kernels

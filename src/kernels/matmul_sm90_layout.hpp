// What braid's Hopper GEMM (matmul_sm90.cu) and the host's layout of its exchange area (matmul_sm90_layout.cpp)
// share: the tile's shape, the all-gather's pieces, and where the area's control words lie. Plain C++, for both
// compilers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_sm90.hpp"

namespace braid::kernels {

constexpr int kTileRows = 128, kTileCols = 256, kTileK = 64;
// An all-gather's piece: 128 rows of a rank's block by kGatherPieceSteps steps of K, a flag each (NOTE [all-gather
// under the loads]).
constexpr int kGatherPieceSteps = 8;

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

}  // namespace braid::kernels

// How scatter and combine's send cut their work, from the shape and the counts alone: every rank computes the same
// plan, as block b pairs with block b of every peer. Host and device (tests/cpu/test_moe_plan.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>  // __host__ __device__

#include "kernels/moe_launch.hpp"

namespace braid::kernels::moe {

constexpr int kRowVectorBytes = 16;  // kernels::kVectorBytes

// Round m of block b sends tokens [(m * blocks + b) * per_round, + per_round) of each list, a warp per row slice.
struct ScatterPlan {
  int slices;          // of a row: a power of two dividing kMoeWarps
  int per_round;       // tokens a block sends each rank a round: kMoeWarps / slices
  int rounds;
  int active_blocks;   // blocks with tokens (the others neither send nor wait)
  size_t slice_bytes;  // a multiple of kRowVectorBytes; slices * slice_bytes >= the row
  bool own_apart;      // block active_blocks + b copies block b's own rows; the active blocks send to peers only
};

constexpr int kLogMoeWarps = 4;
static_assert((1 << kLogMoeWarps) == kMoeWarps, "slices and tokens per round are powers of two");

// `longest`: the longest list any rank sends any rank (< 2^31). One 32-bit division: this is on every call's path.
__host__ __device__ inline ScatterPlan plan_senders(size_t row_bytes, uint32_t longest, uint32_t blocks) {
  // Slices of at least kSliceBytes, thinner while every token fits one round (a decode batch spreads out).
  int log_slices = 0;
  while (log_slices < kLogMoeWarps && row_bytes >= (size_t(2) << log_slices) * kSliceBytes) ++log_slices;
  while (log_slices < kLogMoeWarps && uint64_t(longest) <= uint64_t(blocks) * (kMoeWarps >> (log_slices + 1))) {
    ++log_slices;
  }
  const int log_per_round = kLogMoeWarps - log_slices;
  ScatterPlan plan{};
  plan.slices = 1 << log_slices;
  plan.per_round = 1 << log_per_round;
  plan.slice_bytes = ((row_bytes + plan.slices - 1) >> log_slices) + kRowVectorBytes - 1;
  plan.slice_bytes &= ~size_t(kRowVectorBytes - 1);
  const uint32_t per_round_all = blocks << log_per_round;
  plan.rounds = static_cast<int>((longest + per_round_all - 1) / per_round_all);
  const uint32_t active = (longest + plan.per_round - 1) >> log_per_round;
  plan.active_blocks = static_cast<int>(active < blocks ? active : blocks);
  plan.own_apart = false;
  return plan;
}

// When half the blocks move every list in one round, the other half copy the own rows beside the NVLink stores.
__host__ __device__ inline ScatterPlan plan_scatter(size_t row_bytes, uint32_t longest, uint32_t blocks) {
  if (blocks >= 2) {
    ScatterPlan half = plan_senders(row_bytes, longest, blocks / 2);
    if (half.rounds <= 1) {
      half.own_apart = true;
      return half;
    }
  }
  return plan_senders(row_bytes, longest, blocks);
}

// Combine's send: groups of kCombineGroup threads claim pieces of received tokens as they finish.
struct CombinePlan {
  int pieces;  // of a token: a power of two, at most kCombineSlices
  int blocks;  // with work (the others return at once, no barrier either)
};

// About kCombinePiecesPerGroup pieces a group: whole tokens (1 to K rows) leave groups waiting for the long ones,
// more pieces only add claims. `most_received`: the most any rank received.
constexpr int kCombinePiecesPerGroup = 4;
__host__ __device__ inline CombinePlan plan_combine(int64_t most_received, uint32_t blocks) {
  constexpr int kGroups = kMoeThreads / kCombineGroup;
  const int64_t groups = int64_t(blocks) * kGroups;
  CombinePlan plan{1, 0};
  while (plan.pieces < kCombineSlices && most_received * plan.pieces * 2 <= kCombinePiecesPerGroup * groups) plan.pieces *= 2;
  const int64_t wanted = (most_received * plan.pieces + kGroups - 1) / kGroups;
  plan.blocks = static_cast<int>(wanted < int64_t(blocks) ? wanted : int64_t(blocks));
  return plan;
}

}  // namespace braid::kernels::moe

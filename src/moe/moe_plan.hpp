// How dispatch's scatter and combine's send cut their work, from the shape and the exchanged counts alone, so
// every rank computes the same plan (their blocks pair up with the same block of every peer). Host and device:
// dispatch computes it on the GPU, the CPU tests (tests/cpu/test_moe_plan.cpp) check its rules.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>  // __host__ __device__

#include "moe/moe_launch.hpp"

namespace braid::moe {

constexpr int kRowVectorBytes = 16;  // rows move in 16-byte vectors (kernels::kVectorBytes, elementwise.cuh)

// Scatter moves rows in rounds: in round m block b sends tokens [(m * blocks + b) * per_round, + per_round) of
// each destination's list, a warp per slice of a row.
struct ScatterPlan {
  int slices;          // of a row: a power of two dividing kMoeWarps
  int per_round;       // tokens a block sends to each rank per round: kMoeWarps / slices
  int rounds;          // enough for `longest` tokens
  int active_blocks;   // blocks with tokens in some round (the others neither send nor wait)
  size_t slice_bytes;  // a multiple of kRowVectorBytes; slices * slice_bytes >= the row
  bool own_apart;      // blocks [active_blocks, 2 * active_blocks) copy this rank's own rows (block active_blocks + b
                       // those of block b), so the active blocks send to the peers only
};

constexpr int kLogMoeWarps = 4;
static_assert((1 << kLogMoeWarps) == kMoeWarps, "slices and tokens per round are powers of two");

// `longest`: the longest list any rank sends any rank (< 2^31); `blocks`: the blocks that send. Shifts, products
// and one 32-bit quotient: this is on the critical path of every call, by one thread (a division is a long
// instruction sequence on the GPU).
__host__ __device__ inline ScatterPlan plan_senders(size_t row_bytes, uint32_t longest, uint32_t blocks) {
  // Slices of at least kSliceBytes (a row's loads in flight together) ...
  int log_slices = 0;
  while (log_slices < kLogMoeWarps && row_bytes >= (size_t(2) << log_slices) * kSliceBytes) ++log_slices;
  // ... and thinner while every token still fits one round (ceil(longest / per_round) <= blocks), so that a
  // decode batch spreads over more blocks instead of a few blocks moving several tokens each while the rest idle.
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

// `blocks`: scatter's blocks. When half of them move every list in one round (a decode batch), they send to the
// peers while the other half copy this rank's own rows: those HBM copies then overlap the NVLink stores instead
// of following them in the same warps.
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

// Combine's send: groups of kCombineGroup threads sum pieces of received tokens, claiming them as they finish.
struct CombinePlan {
  int pieces;  // of a token: a power of two, at most kCombineSlices
  int blocks;  // of the send with work (the others return at once: no barrier either)
};

// Tokens are cut into pieces until every group has about kCombinePiecesPerGroup of them: with whole tokens a few
// groups get the long ones (up to K rows here) and the others wait for them; more pieces a group than that only
// add claims. `most_received`: the tokens of the rank that received most; `blocks`: the send's blocks.
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

}  // namespace braid::moe

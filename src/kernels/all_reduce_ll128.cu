// All-reduce, LL128 (ll128.cuh): LL's one shot (reduce_ll.cu) in 128-byte lines of 120 payload bytes and an
// 8-byte flag, the full 64-bit sequence, so stale or never-written lines never match.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/launch_counter.cuh"
#include "kernels/ll.cuh"
#include "kernels/ll128.cuh"
#include "kernels/ll128_launch.hpp"
#include "kernels/ll_launch.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {


// Groups a warp moves per round, in registers from the stores to the reduction; fewer where float32 accumulators
// take more registers. At least 2 × 480 bytes a warp: selection.cpp sizes LL128 launches by it.
template <typename T>
constexpr int kGroupsPerRound = sizeof(T) == 1 ? 2 : sizeof(T) == 2 ? 3 : 4;

// A lane's 16 bytes of one group.
template <typename T>
union Part {
  uint64_t words[2];
  T values[16 / sizeof(T)];
};

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_ll128(LLLaunch launch) {
  static_assert(16 % sizeof(T) == 0 && 8 % sizeof(T) == 0, "a lane's part holds whole elements");
  constexpr int kPerPart = 16 / sizeof(T);
  constexpr int kGroups = kGroupsPerRound<T>;
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank;
  const size_t bytes = launch.count * sizeof(T), groups = (bytes + kLL128WarpPayload - 1) / kLL128WarpPayload;
  const size_t warp = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32, warps = size_t(gridDim.x) * blockDim.x / 32;
  const LanePart part = lane_part();
  const unsigned int lane = threadIdx.x & 31u;
  const int elements = static_cast<int>(part.bytes / sizeof(T));
  auto left_at = [&](size_t offset) { return offset < bytes ? bytes - offset : size_t(0); };
  // Groups of the round from `first`, warp-uniform.
  auto count_from = [&](size_t first) {
    int count = 0;
    while (count < kGroups && first + count * warps < groups) ++count;
    return count;
  };
  Part<T> own[kGroups];
  auto load_own = [&](size_t first, int count) {
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      const size_t offset = (first + i * warps) * kLL128WarpPayload + part.offset;
      if (i < count) load_part(launch.send + offset, left_at(offset), part.bytes, own[i].words);
    }
  };
  // Loaded before the sequence is read: the two round trips overlap.
  load_own(warp, count_from(warp));
  const LaunchStart start = read_launch_start(launch.epoch, launch.pad);
  if (start.stopped) return;  // NOTE [stopped ranks]: no line written or polled
  const uint64_t epoch = start.counter, flag = epoch + 1;
  const size_t parity = flag & 1;
  auto slot = [&](int receiver, int sender) {
    return launch.area[receiver] + (parity * world + sender) * launch.slot_bytes;
  };
  const size_t wire_stride = warps * kLL128WarpWire;  // between a round's groups in a slot
  // An LL line, its flag cut to 32 bits (NOTE [plan lines]).
  send_plan_lines(launch, parity, static_cast<uint32_t>(flag));

  for (size_t first = warp, round = 0; round == 0 || first < groups; first += kGroups * warps, ++round) {
    const int count = count_from(first);
    if (round > 0) load_own(first, count);
    const size_t wire_offset = first * kLL128WarpWire + lane * 16;
    for (int p = 1; p < world; ++p) {
      char* wire = slot((rank + p) % world, rank) + wire_offset;
#pragma unroll
      for (int i = 0; i < kGroups; ++i) {
        if (i < count) store_wire16(wire + i * wire_stride, own[i].words[0], part.carries_flag ? flag : own[i].words[1]);
      }
    }
    if (round == 0) advance_once_read(launch.epoch, launch.blocks_done, epoch);
    if (count == 0) continue;
    acc_t<T> acc[kGroups][kPerPart];
    for (int r = 0; r < world; ++r) {
      Part<T> got[kGroups];
      if (r == rank) {
#pragma unroll
        for (int i = 0; i < kGroups; ++i) got[i] = own[i];
      } else {
        WarpPollBound bound(launch.pad, launch.collective, kSiteLLData, r, ll_plan_check(launch));
        if (!poll_groups(slot(rank, r) + wire_offset, wire_stride, count, true, flag, bound, got)) {
          return;  // warp-uniform
        }
      }
#pragma unroll
      for (int i = 0; i < kGroups; ++i) {
#pragma unroll
        for (int e = 0; e < kPerPart; ++e) {
          if (e < elements) acc[i][e] = r == 0 ? to_acc(got[i].values[e]) : combine<Op>(acc[i][e], to_acc(got[i].values[e]));
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      if (i >= count) continue;
      Part<T> out;
#pragma unroll
      for (int e = 0; e < kPerPart; ++e) {
        if (e < elements) out.values[e] = from_acc<T>(finish<Op>(acc[i][e], world));  // store_part writes only these
      }
      const size_t offset = (first + i * warps) * kLL128WarpPayload + part.offset;
      store_part(launch.recv + offset, left_at(offset), part.bytes, out.words);
    }
  }
  PlanLineHold plan = plan_line_hold(launch, parity);  // polled alone: LL128 polls whole warps of lines
  check_plan_line(launch, plan, static_cast<uint32_t>(flag));  // NOTE [plan lines]
}

}  // namespace

void launch_all_reduce_ll128(DataType type, ReduceOp op, const LLLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_ll128, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

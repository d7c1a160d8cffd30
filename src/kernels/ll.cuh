// Device side of LL (low-latency) calls, beside the line primitives of braid/device/ll_device.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/launch_counter.cuh"
#include "kernels/ll_launch.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {

using device::load_line;
using device::load_wire;
using device::store_line;
using device::store_wire;

// Read once per block. `stopped`: return at once, no line written or polled (NOTE [stopped ranks]).
struct LLCall {
  uint64_t epoch;  // LL calls before this one
  uint32_t flag;  // the sequence (epoch + 1) cut to 32 bits
  size_t parity;
  bool restamps;
  bool stopped;
};

__device__ inline LLCall ll_call(const LLLaunch& launch) {
  const LaunchStart start = read_launch_start(launch.epoch, launch.pad);
  const uint64_t epoch = start.counter, sequence = epoch + 1;
  return LLCall{epoch, static_cast<uint32_t>(sequence), static_cast<size_t>(sequence & 1),
                sequence % kLLRestampPeriod < 2, start.stopped};
}

// Polls check the peer's announcement on this block's barrier channel, so a peer in a barrier kernel for this
// call fails both sides with kMismatch, not a timeout. Needs at most kMaxBlocks blocks (asserted by the host).
__device__ __forceinline__ device::PlanCheck ll_plan_check(const LLLaunch& launch) {
  return device::PlanCheck{launch.plan, static_cast<int>(blockIdx.x)};
}

// NOTE [plan lines]
// Every LL call sends every peer its plan word as an LL line with the call's flag (block 0's thread p, into this
// rank's slot in p's area at launch.plan_line, past the data) and, its data done, waits for p's plan line and
// compares; another plan is a mismatch (answer_mismatch). So differing LL calls fail on every rank, and a smaller
// count cannot finish on a prefix of a longer peer's lines. It also makes every LL call receive from every peer,
// which the parity argument (reduce_ll.cu) needs. Written every call, its flag is never older than the call
// before last: restamp_unwritten_lines skips it.
__device__ __forceinline__ char* plan_line(const LLLaunch& launch, size_t parity, int receiver, int sender) {
  return launch.area[receiver] + (parity * launch.pad.world + sender) * launch.slot_bytes + launch.plan_line;
}

__device__ __forceinline__ int plan_line_peer(const LLLaunch& launch) {
  const int peer = static_cast<int>(threadIdx.x);
  return blockIdx.x == 0 && peer < launch.pad.world && peer != launch.pad.rank ? peer : -1;
}

// Every thread calls it, ahead of the data.
__device__ __forceinline__ void send_plan_lines(const LLLaunch& launch, size_t parity, uint32_t flag) {
  const int peer = plan_line_peer(launch);
  if (peer < 0) return;
  store_wire(plan_line(launch, parity, peer, launch.pad.rank),
             make_uint2(static_cast<uint32_t>(launch.plan), static_cast<uint32_t>(launch.plan >> 32)), flag);
}

// No compiler barrier: PlanLineHold::poll's two loads go out together.
__device__ __forceinline__ uint4 load_wire_bytes(const char* address) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(address));
  return v;
}
__device__ __forceinline__ bool wire_holds(const uint4& wire, uint32_t flag) { return wire.y == flag && wire.w == flag; }

// What an LL poll of `wire` reports on its timeout: the call's flag, and the flag the line's first half holds then.
__device__ __forceinline__ auto ll_progress(const char* wire, uint32_t flag) {
  return device::wait_progress(static_cast<long long>(flag),
                               [wire] { return static_cast<long long>(load_wire_bytes(wire).y); });
}

// Block 0's thread p polls p's plan line with its data lines, so it costs no round trip of its own.
struct PlanLineHold {
  const char* wire = nullptr;  // null: this thread checks none
  int peer = -1;
  bool taken = false;
  uint2 plan = make_uint2(0, 0);

  // True (*line set) once `data` carries `flag`.
  __device__ __forceinline__ bool poll(const char* data, uint32_t flag, uint2* line) {
    const uint4 got = load_wire_bytes(data);
    if (wire != nullptr && !taken) {
      const uint4 theirs = load_wire_bytes(wire);
      if (wire_holds(theirs, flag)) {
        taken = true;
        plan = make_uint2(theirs.x, theirs.z);
      }
    }
    if (!wire_holds(got, flag)) return false;
    *line = make_uint2(got.x, got.z);
    return true;
  }
};

__device__ __forceinline__ PlanLineHold plan_line_hold(const LLLaunch& launch, size_t parity) {
  PlanLineHold hold;
  hold.peer = plan_line_peer(launch);
  if (hold.peer >= 0) hold.wire = plan_line(launch, parity, launch.pad.rank, hold.peer);
  return hold;
}

// False on failure (timeout, or another plan: recorded).
__device__ inline bool check_plan_line(const LLLaunch& launch, PlanLineHold& hold, uint32_t flag) {
  if (hold.wire == nullptr) return true;
  if (!hold.taken && !device::spin_until(launch.pad, [&] { return load_wire(hold.wire, flag, &hold.plan); },
                                         launch.collective, kSiteLLData, hold.peer, 0, ll_plan_check(launch),
                                         ll_progress(hold.wire, flag))) {
    return false;
  }
  const uint64_t theirs = uint64_t(hold.plan.x) | uint64_t(hold.plan.y) << 32;
  if (theirs == launch.plan) return true;
  device::answer_mismatch(launch.pad, ll_plan_check(launch), hold.peer, theirs, launch.collective, kSiteLLData);
  return false;
}

// After the block's stores to peers, before its polls.
__device__ inline void count_ll_call(const LLLaunch& launch, const LLCall& call) {
  advance_once_read(launch.epoch, launch.blocks_done, call.epoch);
}

__device__ __forceinline__ char* ll_slot(const LLLaunch& launch, const LLCall& call, int receiver, int sender) {
  return launch.area[receiver] + (call.parity * launch.pad.world + sender) * launch.slot_bytes;
}

// A 32-bit flag on a line last written 2^32 calls ago, or never (0), would pass for a later call's. So every
// kLLRestampPeriod calls (one per parity) stamp the flag, zero data, on this rank's lines in this parity that no
// peer writes in this call ([written_lines(sender), plan line) per sender): no flag is over about a period old.
// Race-free anywhere in the kernel: no one else touches these lines in this call; earlier stores to them were
// polled here, so landed; a peer rewrites this parity only after receiving this rank's next call
// (NOTE [plan lines]), sent after this kernel. The fence orders the stores before what follows.
template <typename WrittenLines>
__device__ void restamp_unwritten_lines(const LLLaunch& launch, const LLCall& call, WrittenLines written_lines) {
  if (!call.restamps) return;
  const int world = launch.pad.world, rank = launch.pad.rank;
  const size_t slot_lines = launch.plan_line / kLLWireBytes;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (int sender = 0; sender < world; ++sender) {
    if (sender == rank) continue;
    char* slot = ll_slot(launch, call, rank, sender);
    for (size_t i = written_lines(sender) + first; i < slot_lines; i += stride) {
      store_wire(slot + i * kLLWireBytes, make_uint2(0, 0), call.flag);
    }
  }
  __threadfence_system();
}

}  // namespace braid::kernels

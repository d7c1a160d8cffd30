// Device side of braid's LL (low-latency) calls over the communicator's LL area: the call's flag and parity,
// the slots, and the re-stamping of lines a call leaves alone. The line primitives themselves (lines of 8
// payload bytes that travel as one 16-byte store with the flag) are public: braid/device/ll_device.hpp. Shared
// by every LL kernel (reduce_ll.cu, blocks_ll.cu, broadcast_ll.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/launch_counter.cuh"
#include "kernels/ll_launch.hpp"
#include "sync/device_sync.hpp"  // wait sites

namespace braid::kernels {

// The line primitives: braid/device/ll_device.hpp.
using device::load_line;
using device::load_wire;
using device::store_line;
using device::store_wire;

// This call's flag (its sequence number among LL calls, from 1, cut to 32 bits), its parity, and whether it
// re-stamps (restamp_unwritten_lines), read once per block. A kernel whose call finds the rank stopped returns at
// once: it writes no line and polls none (NOTE [stopped ranks]).
struct LLCall {
  uint64_t epoch;  // LL calls before this one (launch.epoch as read); this call's sequence is epoch + 1
  uint32_t flag;
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

// What an LL poll checks while it waits for a peer's lines: the call's plan against the peer's announcement for
// its next barrier on this block's channel (a peer that runs a barrier kernel for this call announces another
// plan there, and the poll answers it with kStoppedPlan: both fail with kMismatch instead of a timeout). A
// peer's LL kernel of another plan announces nothing: its lines do not match, and the poll times out.
// A launch has at most kMaxBlocks blocks, each a barrier channel (collectives.cpp asserts it).
__device__ __forceinline__ device::PlanCheck ll_plan_check(const LLLaunch& launch) {
  return device::PlanCheck{launch.plan, static_cast<int>(blockIdx.x)};
}

// NOTE [plan lines]
// Every LL call tells every peer its plan (the call's plan word) in a line of its own: block 0's thread p stores
// it, as an LL line with the call's flag, into the plan line of this rank's slot in p's area (launch.plan_line,
// past every line a call sends), and, once its data is done, waits for p's plan line in its own area and
// compares (PlanLineHold). Another plan is a mismatch (answer_mismatch: recorded, and every peer's next barrier answered). So
// ranks whose LL calls differ (another count, datatype, op, root, or another LL kernel) fail on every rank, and a
// rank whose count is smaller cannot finish on a prefix of a longer peer's lines: its block 0 waits for the peer's
// plan line first. The plan line is also the line through which every LL call receives from every peer
// (broadcast's non-roots too), which the parity argument needs. Every sender writes its plan line in every call,
// so restamp_unwritten_lines leaves it alone: its flag is never older than the call before last.
__device__ __forceinline__ char* plan_line(const LLLaunch& launch, size_t parity, int receiver, int sender) {
  return launch.area[receiver] + (parity * launch.pad.world + sender) * launch.slot_bytes + launch.plan_line;
}

// The peer whose plan lines this thread sends and checks: block 0's thread p handles peer p; -1 for the others.
__device__ __forceinline__ int plan_line_peer(const LLLaunch& launch) {
  const int peer = static_cast<int>(threadIdx.x);
  return blockIdx.x == 0 && peer < launch.pad.world && peer != launch.pad.rank ? peer : -1;
}

// Block 0's thread p (a peer) stores this call's plan line into p's area; every thread of the block calls it,
// ahead of the call's data.
__device__ __forceinline__ void send_plan_lines(const LLLaunch& launch, size_t parity, uint32_t flag) {
  const int peer = plan_line_peer(launch);
  if (peer < 0) return;
  store_wire(plan_line(launch, parity, peer, launch.pad.rank),
             make_uint2(static_cast<uint32_t>(launch.plan), static_cast<uint32_t>(launch.plan >> 32)), flag);
}

// The 16 bytes of a wire line as one volatile load, with no compiler barrier: two such loads go out together
// (PlanLineHold::poll), where load_wire's first would wait for its value before the second left.
__device__ __forceinline__ uint4 load_wire_bytes(const char* address) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(address));
  return v;
}
__device__ __forceinline__ bool wire_holds(const uint4& wire, uint32_t flag) { return wire.y == flag && wire.w == flag; }

// What block 0's thread p (a peer) holds of p's plan line (NOTE [plan lines]): it polls the plan line together
// with its first data lines, in the same rounds of loads, so that the plan costs no round trip of its own where
// the thread has lines to poll; check_plan_line finishes the wait and compares.
struct PlanLineHold {
  const char* wire = nullptr;  // p's plan line in this rank's area; null: this thread checks none
  int peer = -1;
  bool taken = false;
  uint2 plan = make_uint2(0, 0);

  // One round of a data poll: `data`'s line of this call (true, *line filled, once it carries `flag`), and the
  // plan line while it has not been taken.
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

// Finishes `hold`: waits for the plan line if its polls did not take it, and compares it with this call's plan.
// False when this thread failed (a timeout, or another plan: recorded and answered).
__device__ inline bool check_plan_line(const LLLaunch& launch, PlanLineHold& hold, uint32_t flag) {
  if (hold.wire == nullptr) return true;
  if (!hold.taken && !device::spin_until(launch.pad, [&] { return load_wire(hold.wire, flag, &hold.plan); },
                                         launch.collective, kSiteLLData, hold.peer, 0, ll_plan_check(launch))) {
    return false;
  }
  const uint64_t theirs = uint64_t(hold.plan.x) | uint64_t(hold.plan.y) << 32;
  if (theirs == launch.plan) return true;
  device::answer_mismatch(launch.pad, ll_plan_check(launch), hold.peer, theirs, launch.collective, kSiteLLData);
  return false;
}

// Counts this block in for the next LL call's sequence (advance_once_read): every block calls it once its
// stores to the peers are issued and before it polls.
__device__ inline void count_ll_call(const LLLaunch& launch, const LLCall& call) {
  advance_once_read(launch.epoch, launch.blocks_done, call.epoch);
}

// The slot `sender` fills in `receiver`'s LL area in this call's parity.
__device__ __forceinline__ char* ll_slot(const LLLaunch& launch, const LLCall& call, int receiver, int sender) {
  return launch.area[receiver] + (call.parity * launch.pad.world + sender) * launch.slot_bytes;
}

// Flags are 32 bits of a 64-bit sequence, so a line last written 2^32 calls ago, or never (the area starts
// zeroed: flag 0, the flag of sequence 2^32), would carry a later call's flag and pass for its data. So the calls
// whose sequence is 0 or 1 modulo kLLRestampPeriod (one of each parity) also write this call's flag, with zero
// data, into every line of this rank's own area, in this call's parity, that no peer writes in this call: lines
// [written_lines(sender), plan line) of every other sender's slot (every sender's lines [0, written_lines) and its
// plan line arrive with this call's flag anyway). Every line then carries the flag of a call at most about one period old, which
// no call of the next 2^32 minus a period can carry. The common path pays one compare.
//
// Race-free wherever in the kernel it runs, with no ordering against this call's own stores and polls, and
// with the grid's threads striding over every slot's lines (any block count covers them): in this call no peer
// writes these lines and no receiver reads them (receivers read only what their senders write in this call);
// every earlier store into them was polled by this rank in its own call, so has landed; and a peer writes this
// parity again only in the call after next, which it starts only after receiving this rank's lines of the next
// call (every LL call receives every peer's plan line), sent only once this kernel
// has completed (calls run in order). The fence orders the stores before anything after them.
template <typename WrittenLines>
__device__ void restamp_unwritten_lines(const LLLaunch& launch, const LLCall& call, WrittenLines written_lines) {
  if (!call.restamps) return;
  const int world = launch.pad.world, rank = launch.pad.rank;
  const size_t slot_lines = launch.plan_line / kLLWireBytes;  // the plan line is written in every call
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (int sender = 0; sender < world; ++sender) {
    if (sender == rank) continue;  // no rank sends to itself: its own slot is never read
    char* slot = ll_slot(launch, call, rank, sender);
    for (size_t i = written_lines(sender) + first; i < slot_lines; i += stride) {
      store_wire(slot + i * kLLWireBytes, make_uint2(0, 0), call.flag);
    }
  }
  __threadfence_system();
}

}  // namespace braid::kernels

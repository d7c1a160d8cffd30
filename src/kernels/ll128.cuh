// Device primitives of LL128 lines (ll128_launch.hpp has the line's sizes): a 128-byte line carries 120 payload
// bytes and, in its last 8 bytes, a 64-bit flag. A warp moves 4 lines with one 16-byte store or load a lane: lane
// l holds part l % 8 of line l / 8, and part 7 holds 8 payload bytes and the flag.
//
// Why a line is whole once its flag is there: a warp's 16-byte stores to one 128-byte aligned line leave as one
// NVLink write of the line, which lands whole, and a warp's 16-byte loads of a line read it in one request, so a
// load that sees the flag sees the payload stored with it. That holds between GPUs joined by NVLink (NCCL's LL128
// protocol rests on the same property there), not over PCIe: LL128 runs only where every pair of GPUs reports
// native P2P atomics (CollectiveContext::ll128_lines, agreed at init). Every lane of a line takes part in each of
// its loads and stores, converged.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "kernels/ll128_launch.hpp"

namespace braid::kernels {

// A lane's 16 bytes of a 4-line group: payload bytes [offset, offset + bytes) of the group's 480.
struct LanePart {
  size_t offset;  // in the group's payload
  size_t bytes;   // 16, or 8 for the lane that also carries its line's flag
  bool carries_flag;
};

__device__ __forceinline__ LanePart lane_part() {
  const unsigned int lane = threadIdx.x & 31u, in_line = lane & 7u;
  return LanePart{(lane >> 3) * kLL128LinePayload + in_line * 16, in_line == 7 ? size_t(8) : size_t(16), in_line == 7};
}

__device__ __forceinline__ void store_wire16(char* address, uint64_t low, uint64_t high) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(address), "l"(low), "l"(high) : "memory");
}

__device__ __forceinline__ void load_wire16(const char* address, uint64_t* low, uint64_t* high) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(*low), "=l"(*high) : "l"(address) : "memory");
}

// Up to `size` (16 or 8) bytes of a buffer at `source`, `left` bytes before its end, zero-padded, into `words`.
// Any alignment; the bytes are gathered in registers (no local memory).
__device__ __forceinline__ void load_part(const char* source, size_t left, size_t size, uint64_t* words) {
  if (left >= size && (reinterpret_cast<uintptr_t>(source) & 7) == 0) {
    words[0] = reinterpret_cast<const uint64_t*>(source)[0];
    words[1] = size == 16 ? reinterpret_cast<const uint64_t*>(source)[1] : 0;
    return;
  }
  uint64_t low = 0, high = 0;
  for (size_t i = 0; i < size && i < left; ++i) {
    const uint64_t byte = static_cast<unsigned char>(source[i]);
    if (i < 8) {
      low |= byte << (8 * i);
    } else {
      high |= byte << (8 * (i - 8));
    }
  }
  words[0] = low, words[1] = high;
}

// Writes at most `left` of `size` bytes of `words` to `destination`. Any alignment.
__device__ __forceinline__ void store_part(char* destination, size_t left, size_t size, const uint64_t* words) {
  if (left >= size && (reinterpret_cast<uintptr_t>(destination) & 7) == 0) {
    reinterpret_cast<uint64_t*>(destination)[0] = words[0];
    if (size == 16) reinterpret_cast<uint64_t*>(destination)[1] = words[1];
    return;
  }
  const uint64_t low = words[0], high = words[1];
  for (size_t i = 0; i < size && i < left; ++i) {
    destination[i] = static_cast<char>((i < 8 ? low >> (8 * i) : high >> (8 * (i - 8))) & 0xff);
  }
}

// The bound on a warp's poll of lines, decided for the whole warp: lane 0 keeps the clock and broadcasts. A poll
// ends with a warp vote, so whether to give up must be the same on every lane (device::spin_until decides per
// thread). Every lane calls give_up() after each unsuccessful round of loads. With a PlanCheck, lane 0 also
// watches the peer's barrier announcements, as spin_until does (device::MismatchWatch).
class WarpPollBound {
 public:
  __device__ WarpPollBound(const device::SignalPad& pad, unsigned int collective, unsigned int site, int peer,
                           const device::PlanCheck& check = device::PlanCheck{})
      : pad_(pad), check_(check), collective_(collective), site_(site), peer_(peer) {}

  // True (on every lane) once the wait has timed out (recorded for the host), another wait of the communicator
  // has failed, or the peer runs another plan (answered and recorded).
  __device__ __forceinline__ bool give_up() {
    const bool timer = (threadIdx.x & 31u) == 0;
    if (spins_ == 0 && timer) start_ = device::global_time_ns();
    if ((++spins_ & 1023u) != 0) return false;
    int stop = 0;
    if (timer) {
      const unsigned long long waited = device::global_time_ns() - start_;
      if (waited > pad_.timeout_ns) {
        device::record_error(pad_, device::kErrorTimeout, collective_, site_, peer_, blockIdx.x, waited);
        stop = 1;
      } else if (*static_cast<volatile unsigned int*>(&pad_.error->code) != 0) {
        stop = 1;  // another wait failed
      } else if (uint64_t theirs = 0; watch_.grace_over(pad_, check_, peer_, &theirs)) {
        // the round of loads just before this call, after the first sighting, left the poll unmet
        device::answer_mismatch(pad_, check_, peer_, theirs, collective_, site_);
        stop = 1;
      }
    }
    return __shfl_sync(0xffffffffu, stop, 0) != 0;
  }

 private:
  const device::SignalPad& pad_;
  device::PlanCheck check_;
  device::MismatchWatch watch_;
  unsigned int collective_, site_;
  int peer_;
  unsigned int spins_ = 0;
  unsigned long long start_ = 0;
};

// The two words a lane holds of a group: a plain uint64_t[2], or a union with a `words` member (a type's view).
__device__ __forceinline__ uint64_t* part_words(uint64_t (&words)[2]) { return words; }
template <typename Part>
__device__ __forceinline__ uint64_t* part_words(Part& part) {
  return part.words;
}

// Polls this lane's 16 bytes of `count` (at most kGroups) groups, `stride` bytes apart from `wire` (the lane's address
// in the first), until every line that the warp's `active` lanes read carries `flag`; parts[i] then holds the
// lane's 16 bytes of group i. Every lane of the warp calls it together (`count` the same for the warp), so each load
// reads a group's lines in one request. False (on every lane) once `bound` gave up.
template <int kGroups, typename Part>
__device__ __forceinline__ bool poll_groups(const char* wire, size_t stride, int count, bool active, uint64_t flag,
                                            WarpPollBound& bound, Part (&parts)[kGroups]) {
  const bool carries_flag = (threadIdx.x & 7u) == 7u;
  bool ready[kGroups];
#pragma unroll
  for (int i = 0; i < kGroups; ++i) ready[i] = i >= count;
  for (;;) {
    bool all = true;
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      uint64_t* words = part_words(parts[i]);
      if (!ready[i] && active) load_wire16(wire + i * stride, &words[0], &words[1]);
    }
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      if (!ready[i]) ready[i] = __all_sync(0xffffffffu, !active || !carries_flag || part_words(parts[i])[1] == flag) != 0;
      all = all && ready[i];
    }
    if (all) return true;
    if (bound.give_up()) return false;
  }
}

}  // namespace braid::kernels

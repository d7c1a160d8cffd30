// LL128 line primitives. A warp moves 4 lines with one 16-byte access a lane: lane l holds part l % 8 of line
// l / 8, part 7 the flag. A warp's converged accesses to one aligned line cross NVLink as one request, so a line
// is whole once its flag is there; not over PCIe, so LL128 needs native P2P atomics on every pair (ll128_lines).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "kernels/ll128_launch.hpp"

namespace braid::kernels {

struct LanePart {
  size_t offset;
  size_t bytes;   // 16, or 8 beside the flag
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

// Up to `size` bytes at `source`, `left` before its end, zero-padded. Any alignment.
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

// At most `left` of `size` bytes of `words`. Any alignment.
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

// A warp-uniform poll bound (a poll ends in a warp vote): lane 0 keeps the clock and watches the peer's plan
// (device::MismatchWatch). Every lane calls give_up() after each unmet round.
class WarpPollBound {
 public:
  __device__ WarpPollBound(const device::SignalPad& pad, unsigned int collective, unsigned int site, int peer,
                           const device::PlanCheck& check = device::PlanCheck{})
      : pad_(pad), check_(check), collective_(collective), site_(site), peer_(peer) {}

  // True on every lane once timed out, another wait failed, or the peer runs another plan.
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
      } else if (device::failure_recorded(pad_)) {
        stop = 1;
      } else if (uint64_t theirs = 0; watch_.grace_over(pad_, check_, peer_, &theirs)) {
        // the round of loads since the first sighting was still unmet
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

__device__ __forceinline__ uint64_t* part_words(uint64_t (&words)[2]) { return words; }
template <typename Part>
__device__ __forceinline__ uint64_t* part_words(Part& part) {
  return part.words;
}

// Polls this lane's part of `count` groups, `stride` bytes apart, until every line the `active` lanes read carries
// `flag`. The whole warp calls it. False on every lane once `bound` gave up.
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

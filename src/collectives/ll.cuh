// Device side of the LL (low-latency) protocol: lines of 8 payload bytes that travel as one 16-byte store
// {4 data, flag, 4 data, flag}, whose 8-byte halves arrive whole, so a receiver that sees the call's flag in
// both halves has the payload, with no signal. Shared by every LL kernel (reduce_ll.cu, blocks_ll.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/ll_launch.hpp"

namespace braid::kernels {

// 8 payload bytes of a user buffer at `source`, `left` bytes to its end (the last line is zero-padded).
__device__ __forceinline__ uint2 load_line(const char* source, size_t left) {
  if (left >= kLLLineBytes && (reinterpret_cast<uintptr_t>(source) & 7) == 0) return *reinterpret_cast<const uint2*>(source);
  alignas(8) unsigned char bytes[kLLLineBytes] = {};
  for (size_t i = 0; i < kLLLineBytes && i < left; ++i) bytes[i] = source[i];
  return *reinterpret_cast<const uint2*>(bytes);
}

__device__ __forceinline__ void store_line(char* destination, uint2 line, size_t left) {
  if (left >= kLLLineBytes && (reinterpret_cast<uintptr_t>(destination) & 7) == 0) {
    *reinterpret_cast<uint2*>(destination) = line;
    return;
  }
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&line);
  for (size_t i = 0; i < kLLLineBytes && i < left; ++i) destination[i] = bytes[i];
}

__device__ __forceinline__ void store_wire(char* address, uint2 line, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(line.x), "r"(flag), "r"(line.y),
               "r"(flag)
               : "memory");
}

// True once both halves of the wire line carry `flag`; then *line holds the payload.
__device__ __forceinline__ bool load_wire(const char* address, uint32_t flag, uint2* line) {
  uint32_t low, low_flag, high, high_flag;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(low), "=r"(low_flag), "=r"(high), "=r"(high_flag)
               : "l"(address)
               : "memory");
  if (low_flag != flag || high_flag != flag) return false;
  *line = make_uint2(low, high);
  return true;
}

// This call's flag (its sequence number among LL calls, from 1) and parity, read once per block.
struct LLCall {
  uint32_t flag;
  size_t parity;
};

__device__ inline LLCall ll_call(const LLLaunch& launch) {
  __shared__ uint64_t sequence;
  if (threadIdx.x == 0) sequence = *launch.epoch + 1;
  __syncthreads();
  return LLCall{static_cast<uint32_t>(sequence), static_cast<size_t>(sequence & 1)};
}

// The slot `sender` fills in `receiver`'s LL area in this call's parity.
__device__ __forceinline__ char* ll_slot(const LLLaunch& launch, const LLCall& call, int receiver, int sender) {
  return launch.area[receiver] + (call.parity * launch.pad.world + sender) * launch.slot_bytes;
}

}  // namespace braid::kernels

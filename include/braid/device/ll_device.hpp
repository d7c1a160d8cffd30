// Device primitives of the LL (low-latency) protocol, for braid's LL kernels and for users' own kernels: a line
// of 8 payload bytes travels as one 16-byte store {4 data bytes, flag, 4 data bytes, flag}. The GPU delivers
// each 8-byte half whole (a property of the hardware that NCCL's LL protocol relies on too; PTX's memory model
// does not promise it), so a receiver that reads the expected flag in both halves holds the payload, with no
// signal and no fence between sender and receiver.
//
// Using them in a kernel of your own:
//   - the receiver owns an area of wire lines (kLLWireBytes each) in memory the sender can store to (a
//     symmetric allocation: comm.alloc, its peer pointer on the sender's side);
//   - every use of the area carries a flag that no line of the area holds yet (a call counter that only grows;
//     the area starts zeroed, so never use flag 0 on a fresh area). Flags are 32 bits: before the counter wraps,
//     rewrite every line of the area with a current flag (or stop). Reuse an area (or one of two alternating
//     halves) only once the sender has learned that the receiver finished reading its previous use (a line or
//     signal the receiver sent after it, or a barrier): alternating alone lets a sender run two uses ahead;
//   - the sender packs 8 payload bytes with load_line and stores them with store_wire(line address, payload,
//     flag); the receiver polls load_wire(line address, flag, &payload) until it returns true, then unpacks with
//     store_line. Bound the poll with a timeout (device::global_time_ns in sync_device.hpp).
// store_wire and load_wire are volatile 16-byte accesses to global memory (PTX .volatile: relaxed, system
// scope; today's compilers make them bypass L1); load_line and store_line are plain accesses.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid::device {

constexpr size_t kLLLineBytes = 8;   // payload of one line
constexpr size_t kLLWireBytes = 16;  // one line as stored: two 8-byte {4 data bytes, 4 flag bytes} halves

#if defined(__CUDACC__)

// The 8 payload bytes of a buffer at `source`, `left` bytes before its end (a last line is zero-padded). Any
// alignment.
__device__ __forceinline__ uint2 load_line(const char* source, size_t left) {
  if (left >= kLLLineBytes && (reinterpret_cast<uintptr_t>(source) & 7) == 0) return *reinterpret_cast<const uint2*>(source);
  uint2 line = make_uint2(0, 0);
  unsigned char* bytes = reinterpret_cast<unsigned char*>(&line);
  for (size_t i = 0; i < kLLLineBytes && i < left; ++i) bytes[i] = source[i];
  return line;
}

// Writes a line's payload to `destination`, at most `left` bytes of it. Any alignment.
__device__ __forceinline__ void store_line(char* destination, uint2 line, size_t left) {
  if (left >= kLLLineBytes && (reinterpret_cast<uintptr_t>(destination) & 7) == 0) {
    *reinterpret_cast<uint2*>(destination) = line;
    return;
  }
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&line);
  for (size_t i = 0; i < kLLLineBytes && i < left; ++i) destination[i] = bytes[i];
}

// Stores `line` with `flag` as one wire line at `address` (16-byte aligned).
__device__ __forceinline__ void store_wire(char* address, uint2 line, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(line.x), "r"(flag), "r"(line.y),
               "r"(flag)
               : "memory");
}

// True once both halves of the wire line at `address` (16-byte aligned) carry `flag`; then *line holds the
// payload. False leaves *line alone.
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

#endif  // __CUDACC__

}  // namespace braid::device

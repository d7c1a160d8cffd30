// Device copies by a group of threads (a warp, a block), for braid's kernels and for users' own kernels: any
// alignment and any length, in 16-byte vectors when the source and every destination start 16-byte aligned (then
// kLoadsInFlight loads in flight per thread, which NVLink needs to reach its bandwidth), else in 4-byte words when
// all start 4-byte aligned, else in bytes (one load per thread at a time); the rest after the last whole vector
// or word byte by byte. One source may
// go to several destinations (a row pushed to every peer's buffer is read once). The source and the destinations
// must not overlap, except a destination that is the source itself. Destinations may be peers'
// memory (a symmetric allocation's peer pointers); the copies are plain stores: order them against the peers
// with device::barrier (sync_device.hpp), which every thread of the block calls after its copies, or with
// device::signal from one thread after a __syncthreads that follows the copies. No fence is needed in between:
// the signal's system-scope release is cumulative and covers the block's stores (braid's own kernels rely on
// it). Multicast stores (multimem_device.hpp) are different: they need a system-scope fence first.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid::device {

// Independent 16-byte loads each thread keeps in flight.
constexpr int kLoadsInFlight = 4;

#if defined(__CUDACC__)

// Copies `bytes` from `source` to each of `destination_count` destinations. Every thread of the group calls it
// with the same arguments; `lane` is the thread's index in the group, `width` the group's size.
__device__ inline void group_copy_to(char* const* destinations, int destination_count, const char* source, size_t bytes,
                                     unsigned int lane, unsigned int width) {
  if (bytes == 0) return;
  uintptr_t misaligned = reinterpret_cast<uintptr_t>(source);
  for (int d = 0; d < destination_count; ++d) misaligned |= reinterpret_cast<uintptr_t>(destinations[d]);
  size_t done = 0;
  if ((misaligned & 15) == 0) {
    const size_t vectors = bytes / 16, stride = width;
    const uint4* from = reinterpret_cast<const uint4*>(source);
    // kLoadsInFlight loads in flight before the first store, the last pass too (predicated): a short copy, a row slice
    // of a few vectors per thread, otherwise waits on one load latency per vector.
    for (size_t i = lane; i < vectors; i += kLoadsInFlight * stride) {
      uint4 value[kLoadsInFlight];
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        if (i + u * stride < vectors) value[u] = from[i + u * stride];
      }
      for (int d = 0; d < destination_count; ++d) {
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          if (i + u * stride < vectors) reinterpret_cast<uint4*>(destinations[d])[i + u * stride] = value[u];
        }
      }
    }
    done = vectors * 16;
  } else if ((misaligned & 3) == 0) {
    const size_t words = bytes / 4;
    for (size_t i = lane; i < words; i += width) {
      const uint32_t value = reinterpret_cast<const uint32_t*>(source)[i];
      for (int d = 0; d < destination_count; ++d) reinterpret_cast<uint32_t*>(destinations[d])[i] = value;
    }
    done = words * 4;
  }
  for (size_t i = done + lane; i < bytes; i += width) {
    const char value = source[i];
    for (int d = 0; d < destination_count; ++d) destinations[d][i] = value;
  }
}

// The whole block copies (lane threadIdx.x of blockDim.x; a one-dimensional block).
__device__ inline void block_copy_to(char* const* destinations, int destination_count, const char* source, size_t bytes) {
  group_copy_to(destinations, destination_count, source, bytes, threadIdx.x, blockDim.x);
}

// One warp copies (lane threadIdx.x % 32; all 32 lanes of a full warp of a one-dimensional block call it): many
// warps with a row each keep more requests in flight than one block with a row. Copying a buffer onto itself does
// nothing.
__device__ inline void warp_copy(char* destination, const char* source, size_t bytes) {
  if (destination == source) return;
  group_copy_to(&destination, 1, source, bytes, threadIdx.x & 31u, 32u);
}

// The whole block copies; copying a buffer onto itself does nothing.
__device__ inline void block_copy(char* destination, const char* source, size_t bytes) {
  if (destination == source) return;
  block_copy_to(&destination, 1, source, bytes);
}

#endif  // __CUDACC__

}  // namespace braid::device

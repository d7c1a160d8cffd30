// What the multicast kernels share (all_reduce_multicast.cu, reduce_multicast.cu, all_gather_multicast.cu).
#pragma once

#include "braid/device/multimem_device.hpp"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/multicast_launch.hpp"
#include "kernels/staged.cuh"

namespace braid::kernels {

// This call's half of the region (the epoch's parity). Read once per block at kernel start.
__device__ inline size_t multicast_half(const MulticastLaunch& launch) { return parity_half(launch.epoch, launch.half_bytes); }

__device__ inline void finish_multicast(const MulticastLaunch& launch) {
  advance_after_last_block(launch.epoch, launch.blocks_done);
}

// This rank's share of a block's slice of `vectors`.
struct Share {
  size_t first, end;
};
__device__ inline Share rank_share(size_t vectors, int rank, int world) {
  const size_t base = vectors / world, extra = vectors % world;
  const size_t first = rank * base + (static_cast<size_t>(rank) < extra ? rank : extra);
  return Share{first, first + base + (static_cast<size_t>(rank) < extra ? 1 : 0)};
}

// 16 bytes at any address (user buffers may start anywhere).
__device__ inline uint4 load_vector(const char* from) {
  if ((reinterpret_cast<uintptr_t>(from) & 15) == 0) return *reinterpret_cast<const uint4*>(from);
  uint4 value;
  char* bytes = reinterpret_cast<char*>(&value);
  for (int b = 0; b < 16; ++b) bytes[b] = from[b];
  return value;
}
__device__ inline void store_vector(char* to, uint4 value) {
  if ((reinterpret_cast<uintptr_t>(to) & 15) == 0) {
    *reinterpret_cast<uint4*>(to) = value;
    return;
  }
  const char* bytes = reinterpret_cast<const char*>(&value);
  for (int b = 0; b < 16; ++b) to[b] = bytes[b];
}

// Instantiates `body(type tag, op tag)` for the pairs device::multimem_reduces admits; others: internal error.
template <typename F>
void dispatch_multimem(DataType type, ReduceOp op, F&& body) {
  dispatch_type(type, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    dispatch_op(op, [&](auto op_tag) {
      if constexpr (device::multimem_reduces<T, decltype(op_tag)::value>()) {
        body(type_tag, op_tag);
      } else {
        raise(ErrorCode::kInternal, "{} {} reached a multicast kernel launcher", datatype_name(type), reduce_op_name(op));
      }
    });
  });
}

#define BRAID_LAUNCH_MULTIMEM(kernel, type, op, blocks, stream, launch)                                        \
  ::braid::kernels::dispatch_multimem(type, op, [&](auto type_tag, auto op_tag) {                             \
    using T = typename decltype(type_tag)::type;                                                              \
    ::braid::kernels::launch_dependent(kernel<T, decltype(op_tag)::value>, blocks, ::braid::kernels::kThreadsPerBlock, stream, launch);    \
  })

}  // namespace braid::kernels

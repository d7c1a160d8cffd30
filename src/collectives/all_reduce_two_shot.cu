// All-reduce, two shot: a reduce-scatter then an all-gather by stores. Rank r reduces shard r from every
// peer's staging (reads (world-1)/world of the data over NVLink) and stores the result into every peer's
// staging (writes the same amount), then everyone copies the gathered result out. Moves each byte over NVLink
// about half as often as one shot: the algorithm for large messages.
//
// Staging half layout: [0, count) the input copy ("A"), then [a_bytes, a_bytes + count) the gathered result ("B").
// Block b works on sub-slice b of every shard, so per-channel barriers order everything it touches.
#include "collectives/dispatch.cuh"
#include "collectives/kernels.hpp"
#include "collectives/staged.cuh"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

// Elements per shard: count split in `world` parts, rounded up to whole vectors so shards stay aligned.
template <typename T>
__device__ __forceinline__ size_t shard_elements(size_t count, int world) {
  constexpr size_t kPer = Vector<T>::kCount;
  return ((count + world - 1) / world + kPer - 1) / kPer * kPer;
}

// This block's slice of shard `shard`, clipped to count; offsets in elements from the buffer's start.
template <typename T>
__device__ __forceinline__ Slice shard_slice(size_t count, size_t shard_size, int shard) {
  Slice local = block_slice<T>(shard_size, blockIdx.x, gridDim.x);
  const size_t base = shard * shard_size;
  Slice slice;
  slice.begin = min(base + local.begin, count);
  slice.vector_end = min(base + local.vector_end, count);
  slice.end = min(base + local.end, count);
  // A shard clipped by count may end inside a vector: that part becomes the scalar tail.
  constexpr size_t kPer = Vector<T>::kCount;
  slice.vector_end = slice.begin + (slice.vector_end - slice.begin) / kPer * kPer;
  return slice;
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_two_shot(StagedLaunch launch) {
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  const StagingView staging = staging_view(launch);
  const size_t shard_size = shard_elements<T>(launch.count, world);
  const size_t gathered_offset = (launch.count * sizeof(T) + 255) / 256 * 256;  // "B" after "A", aligned

  for (int shard = 0; shard < world; ++shard) {
    Slice slice = shard_slice<T>(launch.count, shard_size, shard);
    block_copy(staging.of(launch, rank) + slice.begin * sizeof(T), launch.send + slice.begin * sizeof(T),
               (slice.end - slice.begin) * sizeof(T));
  }
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteEntryBarrier)) return;

  const char* sources[kMaxWorld];
  char* destinations[kMaxWorld];
  for (int r = 0; r < world; ++r) {
    sources[r] = staging.of(launch, r);
    destinations[r] = staging.of(launch, r) + gathered_offset;
  }
  block_reduce<T, Op>(sources, world, destinations, world, shard_slice<T>(launch.count, shard_size, rank), 0, 0, world);
  if (!device::barrier(launch.pad, channel, launch.collective, kSiteMiddleBarrier)) return;

  for (int shard = 0; shard < world; ++shard) {
    Slice slice = shard_slice<T>(launch.count, shard_size, shard);
    block_copy(launch.recv + slice.begin * sizeof(T), staging.of(launch, rank) + gathered_offset + slice.begin * sizeof(T),
               (slice.end - slice.begin) * sizeof(T));
  }
  finish_launch(launch);
}

}  // namespace

void launch_all_reduce_two_shot(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(all_reduce_two_shot, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

// Device side of the pipelined collectives: FIFOs of pieces between the same block of every pair of ranks, and
// the split of a buffer into rounds of pieces. A FIFO (phase, channel, sender) is kFifoDepth slots in the
// receiver's area; piece n is in slot (n - 1) mod kFifoDepth, rewritten only once consumed (docs/dev/protocol.md).
#pragma once

#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline_launch.hpp"
#include "kernels/staged_launch.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {

__device__ __forceinline__ int pad_channel(PadChannelSet set) { return set * kPipelineChannels + blockIdx.x; }

__device__ __forceinline__ int fifo_slot(uint64_t count) { return static_cast<int>((count - 1) & (kFifoDepth - 1)); }

__device__ __forceinline__ char* fifo_piece(const PipelineLaunch& launch, int receiver, int phase, int sender, int slot) {
  const size_t index = ((size_t(phase) * kPipelineChannels + blockIdx.x) * launch.pad.world + sender) * kFifoDepth + slot;
  return launch.area[receiver] + index * launch.piece_bytes;
}

static_assert(kMaxWorld <= 32, "peer masks are 32 bits");

// Whole warps of a block with a named barrier; the helpers' shared state serves ids 0 and 1 only.
struct WarpGroup {
  int id;
  int barrier;
  int first;
  int threads;  // a multiple of 32

  __device__ static WarpGroup block() { return WarpGroup{0, 0, 0, static_cast<int>(blockDim.x)}; }
  __device__ static WarpGroup half_of_block(int split) {
    return threadIdx.x < split ? WarpGroup{0, 1, 0, split} : WarpGroup{1, 2, split, static_cast<int>(blockDim.x) - split};
  }
  __device__ int lane() const { return static_cast<int>(threadIdx.x) - first; }
  __device__ void sync() const {
    if (barrier == 0) {
      __syncthreads();
    } else {
      asm volatile("bar.sync %0, %1;" ::"r"(barrier), "r"(threads) : "memory");
    }
  }
  __device__ void copy(char* destination, const char* source, size_t bytes) const {
    if (destination != source) group_copy_to(&destination, 1, source, bytes, lane(), threads);
  }
};

// Pushers of a split block (all-to-all, all-gather); copying out needs more threads (docs/dev/tuning-notes.md).
constexpr int kPushThreads = 128;
static_assert(kPushThreads % 32 == 0 && kPushThreads < kThreadsPerBlock, "the push group is whole warps, the copy group too");

// Thread p (< world, != rank, in `peers`) runs step(p); false on every thread if one failed.
template <typename Step>
__device__ inline bool for_each_peer(const device::SignalPad& pad, Step&& step, unsigned int peers = kEveryPeer,
                                     const WarpGroup& group = WarpGroup::block()) {
  __shared__ int failed[2];
  if (group.lane() == 0) failed[group.id] = 0;
  group.sync();
  const int peer = group.lane();
  if (peer < pad.world && peer != pad.rank && ((peers >> peer) & 1u) && !step(peer)) failed[group.id] = 1;
  group.sync();
  return failed[group.id] == 0;
}

// Waits for the next count of `set` from each peer in `peers`; slots[p]: its FIFO slot.
__device__ inline bool wait_peers(const PipelineLaunch& launch, PadChannelSet set, unsigned int site, int* slots,
                                  unsigned int peers = kEveryPeer, const WarpGroup& group = WarpGroup::block()) {
  return for_each_peer(launch.pad, [&](int peer) {
    uint64_t count = 0;
    const bool arrived = device::wait(launch.pad, pad_channel(set), peer, launch.collective, site, &count,
                                      device::PlanCheck{launch.plan, static_cast<int>(blockIdx.x)});
    slots[peer] = fifo_slot(count);
    return arrived;
  }, peers, group);
}

__device__ inline void post_peers(const PipelineLaunch& launch, PadChannelSet set, unsigned int peers = kEveryPeer,
                                  const WarpGroup& group = WarpGroup::block()) {
  group.sync();
  const int peer = group.lane();
  if (peer < launch.pad.world && peer != launch.pad.rank && ((peers >> peer) & 1u)) {
    device::signal(launch.pad, pad_channel(set), peer);  // its release covers the group's accesses
  }
}

// A rank's link in a chain through every rank. Each round: wait(), read and write, post().
struct ChainLink {
  static constexpr int kDataThread = 0, kCreditThread = 32;
  int previous, next;
  bool receives, forwards;  // the first rank only forwards, the last only receives

  __device__ static ChainLink at(const PipelineLaunch& launch, int position) {
    const int world = launch.pad.world, rank = launch.pad.rank;
    return ChainLink{(rank + world - 1) % world, (rank + 1) % world, position > 0, position < world - 1};
  }

  // Waits (two warps at once) for the previous rank's piece and a free slot of the next rank's FIFO.
  __device__ bool wait(const PipelineLaunch& launch, int* pull, int* push) const {
    __shared__ int arrived[2], slots[2];
    const device::PlanCheck plan{launch.plan, static_cast<int>(blockIdx.x)};
    uint64_t count = 0;
    if (threadIdx.x == kDataThread) {
      arrived[0] = !receives || device::wait(launch.pad, pad_channel(kData1), previous, launch.collective,
                                             kSiteFifoData, &count, plan);
      slots[0] = fifo_slot(count);
    }
    if (threadIdx.x == kCreditThread) {
      arrived[1] = !forwards || device::wait(launch.pad, pad_channel(kFree1), next, launch.collective,
                                             kSiteFifoCredit, &count, plan);
      slots[1] = fifo_slot(count);
    }
    __syncthreads();  // also makes what the block wrote before the call visible to all its threads
    *pull = slots[0];
    *push = slots[1];
    return arrived[0] && arrived[1];
  }

  // After the round's accesses (the barrier).
  __device__ void post(const PipelineLaunch& launch) const {
    __syncthreads();
    if (forwards && threadIdx.x == kDataThread) device::signal(launch.pad, pad_channel(kData1), next);
    if (receives && threadIdx.x == kCreditThread) device::signal(launch.pad, pad_channel(kFree1), previous);
  }
};

// Rounds of gridDim.x × per_block pieces, the last spread in whole vectors; every rank splits alike.
template <typename T>
struct PieceGrid {
  size_t count;
  size_t piece;
  int per_block;

  __device__ size_t units() const { return size_t(gridDim.x) * per_block; }
  __device__ size_t rounds() const { return (count + units() * piece - 1) / (units() * piece); }

  // May be empty.
  __device__ Slice slice(size_t round, int index) const {
    constexpr size_t kPer = Vector<T>::kCount;
    const size_t full = units() * piece, base = round * full;
    const size_t left = min(full, count - base);
    const size_t size = left == full ? piece : ((left + units() - 1) / units() + kPer - 1) / kPer * kPer;
    const size_t k = size_t(blockIdx.x) * per_block + index;
    Slice slice;
    slice.begin = min(base + k * size, base + left);
    slice.end = min(base + (k + 1) * size, base + left);
    slice.vector_end = slice.begin + (slice.end - slice.begin) / kPer * kPer;
    return slice;
  }
};

template <typename T>
__device__ __forceinline__ PieceGrid<T> piece_grid(const PipelineLaunch& launch, int per_block) {
  return PieceGrid<T>{launch.count, launch.piece_bytes / sizeof(T), per_block};
}

template <typename T>
__device__ __forceinline__ Slice slot_slice(size_t elements) {
  constexpr size_t kPer = Vector<T>::kCount;
  return Slice{0, elements, elements / kPer * kPer};
}

// This rank's own piece of `round` (never posted); pieces of at most two rounds live at once.
__device__ __forceinline__ char* own_piece(const PipelineLaunch& launch, int phase, size_t round) {
  return fifo_piece(launch, launch.pad.rank, phase, launch.pad.rank, static_cast<int>(round & (kFifoDepth - 1)));
}

}  // namespace braid::kernels

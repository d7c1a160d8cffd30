// Device side of the pipelined collectives: FIFOs of pieces between the same block (channel) of every pair of
// ranks, and how a launch splits a buffer into rounds of pieces.
//
// A FIFO is kFifoDepth slots in the receiver's pipeline area, one FIFO per (phase, channel, sender). Two
// counters on the signal pad drive it: "data" (the sender posts one per piece written) and "free" (the receiver
// posts one per piece consumed). A sender waits for a free count before it writes a slot; the expected free
// counts start kFifoDepth below zero (DeviceSync::grant_credits), so the first kFifoDepth pieces need no credit.
// The n-th piece (counted from 1 by either side's wait) lives in slot (n - 1) mod kFifoDepth. Counters only grow
// and live across launches, so back-to-back calls and graph replays stay in step, and no slot is ever rewritten
// while its receiver may still read it (race-free reuse).
#pragma once

#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline_launch.hpp"
#include "kernels/staged_launch.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {

__device__ __forceinline__ int pad_channel(PadChannelSet set) { return set * kPipelineChannels + blockIdx.x; }

__device__ __forceinline__ int fifo_slot(uint64_t count) { return static_cast<int>((count - 1) & (kFifoDepth - 1)); }

// Slot `slot` of the FIFO that `sender` fills on `receiver`, for this block's channel and `phase`.
__device__ __forceinline__ char* fifo_piece(const PipelineLaunch& launch, int receiver, int phase, int sender, int slot) {
  const size_t index = ((size_t(phase) * kPipelineChannels + blockIdx.x) * launch.pad.world + sender) * kFifoDepth + slot;
  return launch.area[receiver] + index * launch.piece_bytes;
}

// Peers as a bit mask (bit p: rank p; kEveryPeer, pipeline_launch.hpp, selects all): this rank is always skipped.
static_assert(kMaxWorld <= 32, "peer masks are 32 bits");

// Whole warps of a block that synchronise among themselves, on a named barrier of their own, so that two
// groups of one block can run loops of their own (all-to-all: one group pushes while the other pulls). The
// default is the whole block on barrier 0, __syncthreads' barrier. `id` picks the group's shared state in the
// helpers below, which hold it for two groups (ids 0 and 1); a block cut into more groups (MoE combine's four)
// may use sync(), lane() and copy() only.
struct WarpGroup {
  int id;       // 0: the block, or the first group; 1: the second group
  int barrier;  // hardware barrier: 0 for the whole block, 1 + id for a group
  int first;    // the group's first thread
  int threads;  // a multiple of 32

  __device__ static WarpGroup block() { return WarpGroup{0, 0, 0, static_cast<int>(blockDim.x)}; }
  // The block cut in two at thread `split` (a multiple of 32): group 0 below it, group 1 from it on (split 0:
  // group 1 is the whole block, group 0 has no thread).
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

// Threads of a block that push into the peers' FIFOs where a pipelined kernel splits its blocks (all-to-all,
// all-gather); the rest copy out of this rank's FIFOs. Stores to a peer are posted and forgotten while a copy
// out waits on its HBM loads, so the copy needs more threads: a quarter of the block pushes. Fewer pushers
// leave NVLink idle, more starve the copy, and one group doing both in turn is slower than this split. Tuned
// on 2 ranks only (on 4 there are three pushes a round).
constexpr int kPushThreads = 128;
static_assert(kPushThreads % 32 == 0 && kPushThreads < kThreadsPerBlock, "the push group is whole warps, the copy group too");

// Every thread of the group calls it; thread p of the group (< world, != rank, in `peers`) runs step(p).
// Returns false, for every thread, when a step failed (a wait timed out): the kernel should then return.
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

// Waits for the next count of `set` from every peer in `peers`; slots[p] is the FIFO slot that count names.
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

// Posts one count of `set` to every peer in `peers`, after everything the group wrote (or read) before it.
__device__ inline void post_peers(const PipelineLaunch& launch, PadChannelSet set, unsigned int peers = kEveryPeer,
                                  const WarpGroup& group = WarpGroup::block()) {
  group.sync();
  const int peer = group.lane();
  if (peer < launch.pad.world && peer != launch.pad.rank && ((peers >> peer) & 1u)) {
    device::signal(launch.pad, pad_channel(set), peer);  // its release covers the group's accesses (the barrier)
  }
}

// A rank's link in a chain of every rank (broadcast_chain.cu, reduce_chain.cu): pieces arrive from `previous`
// through this rank's phase-1 FIFO of that sender and go on into `next`'s. Each round, every thread of the block
// calls wait() (after which it may read the piece and write the next rank's slot), then post() once it is done
// with both. The two waits of a round run at once, in one thread of each of two warps, and the two signals leave
// from different warps.
struct ChainLink {
  static constexpr int kDataThread = 0, kCreditThread = 32;
  int previous, next;
  bool receives, forwards;  // the first rank of the chain only forwards, the last only receives

  // The link of the rank at `position` in the chain (0: its first rank) of rank order from that first rank on.
  __device__ static ChainLink at(const PipelineLaunch& launch, int position) {
    const int world = launch.pad.world, rank = launch.pad.rank;
    return ChainLink{(rank + world - 1) % world, (rank + 1) % world, position > 0, position < world - 1};
  }

  // Waits for the previous rank's next piece (receives) and for a free slot of the next rank's FIFO (forwards);
  // *pull and *push are their slots. Returns false, for every thread, when a wait failed (timed out).
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

  // Hands the previous rank's slot back and posts the piece to the next rank, after the block's loads and stores
  // of the round (the barrier); the next wait() may follow at once.
  __device__ void post(const PipelineLaunch& launch) const {
    __syncthreads();
    if (forwards && threadIdx.x == kDataThread) device::signal(launch.pad, pad_channel(kData1), next);
    if (receives && threadIdx.x == kCreditThread) device::signal(launch.pad, pad_channel(kFree1), previous);
  }
};

// How a launch splits `count` elements into pieces: rounds of gridDim.x × per_block pieces, piece k of a
// round for block k / per_block. Full rounds use pieces of the FIFO slot's size; the last round spreads what is
// left evenly in whole vectors. Every rank computes the same split, so a block's pieces match its peers'.
template <typename T>
struct PieceGrid {
  size_t count;
  size_t piece;  // elements of a full piece
  int per_block;

  __device__ size_t units() const { return size_t(gridDim.x) * per_block; }
  __device__ size_t rounds() const { return (count + units() * piece - 1) / (units() * piece); }

  // Piece `index` (of this block's per_block) of `round`, in elements from the buffer's start; may be empty.
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

// A slice of `elements` starting at 0 (a FIFO slot's content).
template <typename T>
__device__ __forceinline__ Slice slot_slice(size_t elements) {
  constexpr size_t kPer = Vector<T>::kCount;
  return Slice{0, elements, elements / kPer * kPer};
}

// The slot this rank keeps its own piece of `round` in (never posted: its own FIFO from itself). Pieces of
// at most two consecutive rounds are alive at once, so kFifoDepth slots keep them apart.
__device__ __forceinline__ char* own_piece(const PipelineLaunch& launch, int phase, size_t round) {
  return fifo_piece(launch, launch.pad.rank, phase, launch.pad.rank, static_cast<int>(round & (kFifoDepth - 1)));
}

}  // namespace braid::kernels

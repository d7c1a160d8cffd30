// The entry of the announcing kernels (announced_launch.hpp): every rank announces where its buffers lie, passes
// the entry barrier, and finds the peers' buffers in its exposure table; then every rank runs zero copy, or, where
// any rank announced a buffer as staged, every rank runs the kernel's staged path (all saw the same words).
// Staged paths move the call in rounds of one staging half (NOTE [announced staged rounds]).
// verify/models/announced_gather.pml models the announcements, the one decision and the rounds' halves
// (docs/dev/protocol.md).
#pragma once

#include "kernels/announced_launch.hpp"
#include "kernels/elementwise.cuh"
#include "kernels/launch_counter.cuh"
#include "sync/device_sync.hpp"

namespace braid::kernels {

// Where `sender` announced buffer `buffer` to this block's channel, for the barrier of `count` (as plan_slot).
__device__ __forceinline__ uint64_t* announcement_slot(uint64_t* area, int world, int channel, int sender,
                                                       uint64_t count, int buffer) {
  return area + ((static_cast<size_t>(channel) * world + sender) * 2 + (count & 1)) * kAnnouncedBuffers + buffer;
}

__device__ __forceinline__ uint64_t load_acquire_gpu(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void store_release_gpu(uint64_t* address, uint64_t value) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

// NOTE [exposure cache]
// The exposure table lies in pinned host memory (NOTE [exposure table writes]), and loads of host memory from
// many blocks at once are served one after another: three per block and peer cost a call about 100 us. So each
// GPU keeps a copy of the slots it used in device memory (ExposureLookup::cache): a block looks there first, and
// only where the slot there holds another id it reads the host table and fills the copy (base and length, then
// the id with release, GPU scope). A range's id is never reused by its owner, so a cached slot that holds the
// announced id holds that range. Two blocks that fill a slot at once write the same range: a slot holds another
// id only once that id was withdrawn, and its owner withdraws it only after its calls ended, that is after every
// peer's kernels looked it up (they did so before the barriers of those calls).

// Slot `slot` of the exposure table for `id`: from the device copy where it holds the id, else from the host
// table (copied into the device copy where it holds the id there). {0, 0, 0} where neither does.
__device__ __forceinline__ ExposedRange exposed_range(const ExposureLookup& lookup, size_t slot, uint64_t id) {
  ExposedRange* cached = lookup.cache + slot;
  if (load_acquire_gpu(&cached->id) == id) return ExposedRange{id, cached->base, cached->bytes};
  const ExposedRange* entry = lookup.table + slot;
  const uint64_t held = device::load_acquire_system(&entry->id);  // the helper stored the id last (release)
  if (held != id) return ExposedRange{0, 0, 0};
  const ExposedRange range{id, device::load_relaxed_system(&entry->base), device::load_relaxed_system(&entry->bytes)};
  cached->base = range.base;
  cached->bytes = range.bytes;
  store_release_gpu(&cached->id, id);
  return range;
}

// Rank `owner`'s buffer of `bytes` as announced by `word`, mapped here; null where the word says staged.
// `found` is false where the word names a range this rank's table does not hold as announced (NOTE [exposure table
// writes] says why that cannot happen for a range its owner exposed).
__device__ __forceinline__ char* resolve(const ExposureLookup& lookup, int owner, uint64_t word, size_t bytes,
                                         bool& found) {
  found = true;
  if (word == kAnnouncedStaged) return nullptr;
  const uint64_t id = word >> kAnnouncedOffsetBits, offset = word & kAnnouncedOffsetMask;
  const ExposedRange range = exposed_range(lookup, exposure_slot(owner, id), id);
  if (range.id != id || offset > range.bytes || bytes > range.bytes - offset) {
    found = false;
    return nullptr;
  }
  return reinterpret_cast<char*>(range.base + offset);
}

enum class AnnouncedPath { kEnd, kZeroCopy, kStaged };

// What the entry gives the block: the path, the launch counter (the staged rounds' first half), and every rank's
// buffers (own ones included), in shared memory: buffers[b][r] is rank r's buffer b as mapped here.
struct AnnouncedEntry {
  AnnouncedPath path;
  uint64_t counter;
};

// The entry of an announcing kernel, for every thread of the block: announces this rank's words to every peer
// (thread p to peer p), runs before_barrier(launch counter) (a rank whose own word makes the call staged copies
// its first round in there: NOTE [announced staged rounds]), passes the entry barrier, and resolves the peers'
// words. kEnd where the block must end:
// a stopped rank (NOTE [stopped ranks]: it announces nothing and answers the barrier), a failed barrier, or a
// word naming a range this rank never mapped (recorded: rather fail than write anywhere; the peers then wait for
// this rank at their next barrier until the timeout).
template <typename BeforeBarrier>
__device__ inline AnnouncedEntry enter_announced(const AnnouncedLaunch& launch, char* (&buffers)[kAnnouncedBuffers][kMaxWorld],
                                                 char* const (&own)[kAnnouncedBuffers], BeforeBarrier&& before_barrier) {
  const StagedLaunch& call = launch.staged;
  const device::SignalPad& pad = call.pad;
  // Thread b * kMaxWorld + p announces buffer b to peer p and resolves peer p's buffer b: one dependent chain of
  // loads a thread, the buffers' side by side.
  const int world = pad.world, rank = pad.rank, channel = blockIdx.x;
  const int peer = threadIdx.x % kMaxWorld, b = threadIdx.x / kMaxWorld;
  const bool mine = b < launch.buffers && peer < world && peer != rank;
  const LaunchStart start = read_launch_start(call.epoch, pad);
  if (start.stopped) {
    device::barrier(pad, channel, call.collective, kSiteEntryBarrier, call.plan);
    return AnnouncedEntry{AnnouncedPath::kEnd, start.counter};
  }
  advance_once_read(call.epoch, call.blocks_done, start.counter);
  // The slot of the entry barrier's count on this channel (the barrier's signal releases the stores: its
  // __syncthreads orders them first).
  uint64_t count = 0;
  if (mine) {
    count = pad.expected[channel * world + peer] + 1;
    device::store_relaxed_system(announcement_slot(launch.area.peers[peer], world, channel, rank, count, b),
                                 launch.words[b]);
  }
  __shared__ int staged, unknown;
  if (threadIdx.x == 0) {
    staged = 0;
    unknown = -1;
    for (int k = 0; k < launch.buffers; ++k) {
      staged |= launch.words[k] == kAnnouncedStaged;
      buffers[k][rank] = own[k];
    }
  }
  before_barrier(start.counter);  // the barrier's first __syncthreads orders what it writes before the signal
  if (!device::barrier(pad, channel, call.collective, kSiteEntryBarrier, call.plan)) {
    return AnnouncedEntry{AnnouncedPath::kEnd, start.counter};
  }
  // Thread p read peer p's signal (acquire) in the barrier, whose last __syncthreads orders that before every
  // thread's loads: peer p's announcements are here.
  if (mine) {
    const uint64_t word =
        device::load_relaxed_system(announcement_slot(launch.area.local, world, channel, peer, count, b));
    bool found = true;
    buffers[b][peer] = resolve(launch.exposures, peer, word, launch.extents[b], found);
    if (buffers[b][peer] == nullptr) atomicOr(&staged, 1);
    if (!found) atomicMax(&unknown, peer);
  }
  __syncthreads();
  if (unknown >= 0) {
    if (threadIdx.x == 0) {
      device::record_error(pad, device::kErrorPlanMismatch, call.collective, kSiteEntryBarrier, unknown, channel, 0,
                           static_cast<long long>(launch.words[0]), 0);
    }
    return AnnouncedEntry{AnnouncedPath::kEnd, start.counter};
  }
  return AnnouncedEntry{staged ? AnnouncedPath::kStaged : AnnouncedPath::kZeroCopy, start.counter};
}

// NOTE [announced staged rounds]
// Where some rank announced a buffer as staged, every rank (all saw the same words) runs the staged path in
// rounds of one staging half: copy this rank's part of the round into its half, barrier, read every rank's half
// into the output. Round i uses half (launch counter + i) mod 2. A half is written again two rounds later, after
// the barrier of the round between, which every peer's block of this channel passes only once it has read the
// half. Every round splits its elements between blocks as a full round does (a short last round only clips that
// split), so a block writes only what the same block of every peer has read. A round reads only the part of the
// input it stages and writes only the same part of the output, so in place is safe.
// A rank whose own word makes the call staged whatever the peers announce copies round 0 in before the entry
// barrier, as the selection table's staged kernels do; where every rank did, the entry barrier is round 0's
// barrier. A call of more than one round ends with a last barrier, so the next call may write any half; a call of
// one round ends as the staged kernels do, without one: the next call writes the other half, and the one after
// starts only once every peer entered the next (its entry barrier), having read this one's half.
template <typename Element>
struct StagedRounds {
  const StagedLaunch& launch;
  size_t chunk;  // elements a round
  size_t rounds;
  Slice full;  // this block's part of a full round

  __device__ StagedRounds(const StagedLaunch& staged, size_t chunk_elements)
      : launch(staged),
        chunk(chunk_elements),
        rounds((staged.count + chunk_elements - 1) / chunk_elements),
        full(block_slice<Element>(chunk_elements, blockIdx.x, gridDim.x)) {}

  // This block's slice of round `round`: the full round's split, clipped to what the round holds.
  __device__ Slice slice(size_t round) const {
    const size_t count = launch.count - round * chunk < chunk ? launch.count - round * chunk : chunk;
    return clip_slice(full, count, blockIdx.x == gridDim.x - 1, Vector<Element>::kCount);
  }
  __device__ size_t half(uint64_t counter, size_t round) const { return ((counter + round) & 1) * launch.half_bytes; }

  // Round 0's copy, before the entry barrier. copy_in gets the round's first element, this block's slice of the
  // round (from that element) and the byte offset of the round's half.
  template <typename CopyIn>
  __device__ void copy_first(uint64_t counter, CopyIn&& copy_in) const {
    if (rounds > 0) copy_in(size_t(0), slice(0), half(counter, 0));
  }

  // Every round after the entry barrier: `copied_first` where this rank ran copy_first, `everyone_copied_first`
  // where every rank did (the same on every rank). read_out gets what copy_in gets.
  template <typename CopyIn, typename ReadOut>
  __device__ void run(uint64_t counter, bool copied_first, bool everyone_copied_first, CopyIn&& copy_in,
                      ReadOut&& read_out) const {
    for (size_t round = 0; round < rounds; ++round) {
      const Slice part = slice(round);
      if (round > 0 || !copied_first) copy_in(round * chunk, part, half(counter, round));
      if (round > 0 || !everyone_copied_first) {
        if (!device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteMiddleBarrier, launch.plan)) return;
      }
      read_out(round * chunk, part, half(counter, round));
    }
    if (rounds != 1) device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteExitBarrier, launch.plan);
  }
};

// Whether every rank announced at least one of the buffers in `mask` (bit b: buffer b) as staged: this rank by its
// words, the peers by what their words resolved to. The same on every rank.
__device__ inline bool every_rank_staged(const AnnouncedLaunch& launch,
                                         char* const (&buffers)[kAnnouncedBuffers][kMaxWorld], unsigned mask) {
  const int world = launch.staged.pad.world, rank = launch.staged.pad.rank;
  for (int q = 0; q < world; ++q) {
    bool staged = false;
    for (int b = 0; b < launch.buffers; ++b) {
      if ((mask >> b & 1u) == 0) continue;
      staged |= q == rank ? launch.words[b] == kAnnouncedStaged : buffers[b][q] == nullptr;
    }
    if (!staged) return false;
  }
  return true;
}

// Whether this rank announced one of the buffers in `mask` as staged.
__device__ inline bool staged_here(const AnnouncedLaunch& launch, unsigned mask) {
  bool staged = false;
  for (int b = 0; b < launch.buffers; ++b) staged |= (mask >> b & 1u) != 0 && launch.words[b] == kAnnouncedStaged;
  return staged;
}

// The chunk of a round whose staging holds `parts` parts of one chunk each (whole 256-byte lines), in elements.
__device__ __forceinline__ size_t staged_chunk(const StagedLaunch& launch, int parts, size_t element_bytes) {
  return launch.half_bytes / parts / 256 * 256 / element_bytes;
}

}  // namespace braid::kernels

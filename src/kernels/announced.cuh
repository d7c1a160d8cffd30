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
// (thread p to peer p), passes the entry barrier, and resolves the peers' words. kEnd where the block must end:
// a stopped rank (NOTE [stopped ranks]: it announces nothing and answers the barrier), a failed barrier, or a
// word naming a range this rank never mapped (recorded: rather fail than write anywhere; the peers then wait for
// this rank at their next barrier until the timeout).
__device__ inline AnnouncedEntry enter_announced(const AnnouncedLaunch& launch, char* (&buffers)[kAnnouncedBuffers][kMaxWorld],
                                                 char* const (&own)[kAnnouncedBuffers]) {
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
// split), so a block writes only what the same block of every peer has read. A last barrier ends the kernel, so
// the next call may write any half. A round reads only the part of the input it stages and writes only the same
// part of the output, so in place is safe.
//
// launch.count Elements in rounds of `chunk`; copy_in and read_out get the round's first element, this block's
// slice of the round (from that element) and the byte offset of the round's half.
template <typename Element, typename CopyIn, typename ReadOut>
__device__ __forceinline__ void run_staged_rounds(const StagedLaunch& launch, uint64_t counter, size_t chunk,
                                                  CopyIn&& copy_in, ReadOut&& read_out) {
  const size_t rounds = (launch.count + chunk - 1) / chunk;
  const Slice full = block_slice<Element>(chunk, blockIdx.x, gridDim.x);
  const auto slice_of = [&](size_t round) {  // the full round's split, clipped to what the round holds
    const size_t count = launch.count - round * chunk < chunk ? launch.count - round * chunk : chunk;
    const size_t vectors_end = count / Vector<Element>::kCount * Vector<Element>::kCount;
    const bool tail = (full.begin <= vectors_end && vectors_end < full.vector_end) || blockIdx.x == gridDim.x - 1;
    Slice slice;
    slice.begin = full.begin < count ? full.begin : count;
    slice.vector_end = full.vector_end < vectors_end ? full.vector_end : vectors_end;
    if (slice.vector_end < slice.begin) slice.vector_end = slice.begin;
    slice.end = tail ? count : slice.vector_end;  // the scalar tail: the block whose vectors reach it
    return slice;
  };
  const auto half_of = [&](size_t round) { return ((counter + round) & 1) * launch.half_bytes; };
  for (size_t round = 0; round < rounds; ++round) {
    const Slice slice = slice_of(round);
    copy_in(round * chunk, slice, half_of(round));
    if (!device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteMiddleBarrier, launch.plan)) return;
    read_out(round * chunk, slice, half_of(round));
  }
  device::barrier(launch.pad, blockIdx.x, launch.collective, kSiteExitBarrier, launch.plan);
}

// The chunk of a round whose staging holds `parts` parts of one chunk each (whole 256-byte lines), in elements.
__device__ __forceinline__ size_t staged_chunk(const StagedLaunch& launch, int parts, size_t element_bytes) {
  return launch.half_bytes / parts / 256 * 256 / element_bytes;
}

}  // namespace braid::kernels

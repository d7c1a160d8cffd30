// All-gather of an eager call that announces its output (announced_launch.hpp). Entry barrier: every rank's
// announcement is here. Every rank's output exposed: rank r stores its input into block r of each (zero copy),
// then an exit barrier. Any rank's not: every rank stages, in rounds of a staging half (NOTE [announced staged
// rounds]). launch.staged.count: bytes of one rank's block. verify/models/announced_gather.pml models the
// announcements, the one decision and the rounds' halves (docs/dev/protocol.md).
#include "core/kernel_modules.hpp"
#include "kernels/announced_launch.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/launch_counter.cuh"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

// Where `sender` announced to this block's channel, for the barrier of `count` (as plan_slot, in the area).
__device__ __forceinline__ uint64_t* announcement_slot(uint64_t* area, int world, int channel, int sender,
                                                       uint64_t count) {
  return area + (static_cast<size_t>(channel) * world + sender) * 2 + (count & 1);
}

// NOTE [exposure cache]
// The exposure table lies in pinned host memory (NOTE [exposure table writes]), and loads of host memory from
// many blocks at once are served one after another: three per block and peer cost a call about 100 us. So each
// GPU keeps a copy of the slots it used in device memory (ExposureTable::device_cache): a block looks there
// first, and only where the slot there holds another id it reads the host table and fills the copy (base and
// length, then the id with release, GPU scope). A range's id is never reused by its owner, so a cached slot that
// holds the announced id holds that range. Two blocks that fill a slot at once write the same range: a slot
// holds another id only once that id was withdrawn, and its owner withdraws it only after its calls ended, that is
// after every peer's kernels looked it up (they did so before the barriers of those calls).
__device__ __forceinline__ uint64_t load_acquire_gpu(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void store_release_gpu(uint64_t* address, uint64_t value) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

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

// NOTE [announced staged rounds]
// Where some rank announced no exposed output, every rank (all saw the same words) runs the staged all-gather in
// rounds of one staging half: copy this rank's part of the round into its half, barrier, copy every rank's half
// into the output. Round i uses half (launch counter + i) mod 2. A half is written again two rounds later, after
// the barrier of the round between, which every peer's block of this channel passes only once it has read the
// half (the same slices, in program order); a last barrier ends the kernel, so the next call may write any half.
__device__ void gather_staged_rounds(const StagedLaunch& launch, uint64_t counter) {
  const int world = launch.pad.world, rank = launch.pad.rank, channel = blockIdx.x;
  const size_t rounds = (launch.count + launch.half_bytes - 1) / launch.half_bytes;
  for (size_t round = 0; round < rounds; ++round) {
    const size_t first = round * launch.half_bytes;
    const size_t bytes = launch.count - first < launch.half_bytes ? launch.count - first : launch.half_bytes;
    const size_t half = ((counter + round) & 1) * launch.half_bytes;
    const Slice slice = block_slice<uint8_t>(bytes, blockIdx.x, gridDim.x);
    const size_t length = slice.end - slice.begin;
    block_copy(launch.staging[rank] + half + slice.begin, launch.send + first + slice.begin, length);
    if (!device::barrier(launch.pad, channel, launch.collective, kSiteMiddleBarrier, launch.plan)) return;
    for (int step = 0; step < world; ++step) {
      const int q = (rank + step) % world;  // rotated: spreads the links' load
      char* to = launch.recv + q * launch.rank_stride + first + slice.begin;
      const char* from = q == rank ? launch.send + first + slice.begin : launch.staging[q] + half + slice.begin;
      if (to != from) block_copy(to, from, length);  // in place: the own block is there
    }
  }
  device::barrier(launch.pad, channel, launch.collective, kSiteExitBarrier, launch.plan);
}

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_announced(AnnouncedLaunch launch) {
  start_dependent_kernel();
  const StagedLaunch& call = launch.staged;
  const device::SignalPad& pad = call.pad;
  const int world = pad.world, rank = pad.rank, channel = blockIdx.x, peer = threadIdx.x;
  const LaunchStart start = read_launch_start(call.epoch, pad);
  if (start.stopped) {  // NOTE [stopped ranks]: announce nothing, answer the entry barrier
    device::barrier(pad, channel, call.collective, kSiteEntryBarrier, call.plan);
    return;
  }
  advance_once_read(call.epoch, call.blocks_done, start.counter);
  // Thread p announces to peer p, in the slot of the entry barrier's count on this channel (the barrier's signal
  // releases it: its __syncthreads orders this store first).
  uint64_t count = 0;
  if (peer < world && peer != rank) {
    count = pad.expected[channel * world + peer] + 1;
    device::store_relaxed_system(announcement_slot(launch.area.peers[peer], world, channel, rank, count), launch.word);
  }
  __shared__ char* outputs[kMaxWorld];
  __shared__ int staged, unknown;
  if (peer == 0) {
    staged = launch.word == kAnnouncedStaged;
    unknown = -1;
  }
  if (!device::barrier(pad, channel, call.collective, kSiteEntryBarrier, call.plan)) return;
  // Thread p read peer p's signal (acquire) in the barrier: peer p's announcement is here.
  if (peer < world && peer != rank) {
    const uint64_t word = device::load_relaxed_system(announcement_slot(launch.area.local, world, channel, peer, count));
    bool found = true;
    outputs[peer] = resolve(launch.exposures, peer, word, world * call.rank_stride, found);
    if (outputs[peer] == nullptr) atomicOr(&staged, 1);
    if (!found) atomicMax(&unknown, peer);
  }
  __syncthreads();
  if (unknown >= 0) {
    // The peer's announcement names a range this rank never mapped: fail rather than write anywhere. The peers
    // then wait for this rank at their next barrier until the timeout.
    if (threadIdx.x == 0) {
      device::record_error(pad, device::kErrorPlanMismatch, call.collective, kSiteEntryBarrier, unknown, channel, 0,
                           static_cast<long long>(launch.word), 0);
    }
    return;
  }
  if (staged) {
    gather_staged_rounds(call, start.counter);
    return;
  }
  if (peer == 0) outputs[rank] = call.recv;
  __syncthreads();
  const Slice part = block_slice<uint8_t>(call.count, blockIdx.x, gridDim.x);
  const char* source = call.send + part.begin;
  char* destinations[kMaxWorld];
  int destination_count = 0;
  for (int k = 0; k < world; ++k) {
    char* to = outputs[(rank + k) % world] + rank * call.rank_stride + part.begin;  // rotated
    if (to != source) destinations[destination_count++] = to;                      // in place
  }
  block_copy_to(destinations, destination_count, source, part.end - part.begin);
  device::barrier(pad, channel, call.collective, kSiteExitBarrier, call.plan);
}

}  // namespace

void launch_all_gather_announced(const AnnouncedLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_gather_announced, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()

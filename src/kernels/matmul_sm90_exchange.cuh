// braid's Hopper GEMM (matmul_sm90.cu), what its three kinds of exchange share: the kernel's view of the exchange
// area, the waits for a peer's words, the further peers' rows added to the accumulators, and the last block's
// stores (NOTE [reduce-scatter in the epilogue], NOTE [all-gather under the loads], NOTE [reduce-scatter by the
// copy engines]). Included by matmul_sm90.cu alone, whose anonymous namespace its pieces join.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "kernels/collective_id.hpp"
#include "kernels/matmul_sm90.hpp"
#include "kernels/matmul_sm90_epilogue.cuh"
#include "kernels/matmul_sm90_layout.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

// Spins until `word` (written by `peer`) reaches `target` (words compared by their difference). False where the
// wait gave up: it timed out (recorded in the pad's fatal word) or a failure is recorded there; the rank is then
// stopped (NOTE [stopped ranks]).
__device__ __forceinline__ bool wait_for_word(const device::SignalPad& pad, const uint64_t* word, uint64_t target,
                                              Collective collective, unsigned int site, int peer) {
  return device::spin_until(pad, [&] { return device::reached(device::load_acquire_system(word), target); },
                            static_cast<unsigned int>(collective), site, peer, 0);
}

__device__ __forceinline__ void store_release_system(uint64_t* word, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
}

// The copy engine's views of the exchange areas' received blocks: [(world - 1) x block_rows, columns] from
// received_offset, in the 128-byte swizzle; a reduce-scatter's in boxes of 64 rows x 64 columns (the staging
// buffers' layout), an all-gather's in A's tiles.
struct ExchangeMaps {
  CUtensorMap received;                      // this rank's
  CUtensorMap peers[kSm90ExchangeMaxWorld];  // every peer's, mapped here (this rank's entry unused)
  CUtensorMap gathered;                      // an all-gather's gathered A, [world x block_rows, k] (if asked for)
};
struct NoExchangeMaps {};

// The kernel's view of an exchange (NOTE [reduce-scatter in the epilogue]); world 0: none.
struct ExchangeView {
  Sm90Exchange x;
  int m_blocks;     // 128-row blocks of A
  int shift;        // the rotation of the schedule's rows, in 128-row blocks
  int n_blocks;     // 256-column blocks of D
  size_t flags_per_peer;  // a reduce-scatter's 64-row half-tiles of a block, an all-gather's pieces of a block
  int pieces;       // an all-gather's pieces of a 128-row block (kGatherPieceSteps steps of K each)
  int chunk_rows;   // kEngineReduceScatter: the rows of a chunk (NOTE [reduce-scatter by the copy engines])

  // The 128-row block of A the schedule's block `logical` stands for.
  __device__ int rotate(int logical) const {
    return x.world == 0 || logical >= m_blocks ? logical : (logical + shift) % m_blocks;
  }
  __device__ uint64_t* control(uint8_t* area, size_t offset) const {
    return reinterpret_cast<uint64_t*>(area + offset);
  }
  // The freed word in `area` that rank q writes: the calls of q that have read what the area's rank sent it.
  __device__ uint64_t* freed(uint8_t* area, int q) const { return control(area, kFreedOffset + q * sizeof(uint64_t)); }
  // The flag `index` (a half-tile, or a piece) that the peer slot + 1 places after this rank (slot 0: rank + 1)
  // sends (slot_of).
  __device__ uint64_t* flag(uint8_t* area, int slot, size_t index) const {
    return reinterpret_cast<uint64_t*>(area + kSm90ExchangeFlagsOffset) + slot * flags_per_peer + index;
  }
  __device__ int slot_of(int sender, int receiver) const { return (sender - receiver - 1 + x.world) % x.world; }
  // kEngineReduceScatter's words in `area` (NOTE [reduce-scatter by the copy engines]): the ready count of this
  // rank's products for the peer destination + 1 places after it, and the arrived flag of the peer slot + 1 places
  // after it (slot_of), for chunk `chunk`.
  __device__ uint64_t* ready(uint8_t* area, int destination, int chunk) const {
    return control(area, kEngineReadyOffset + (destination * kSm90EngineMaxChunks + chunk) * sizeof(uint64_t));
  }
  __device__ uint64_t* arrived(uint8_t* area, int slot, int chunk) const {
    return control(area, kEngineArrivedOffset + (slot * kSm90EngineMaxChunks + chunk) * sizeof(uint64_t));
  }
  // The flag of consumer 0's half of the tile at `local_row0` (of its owner's block) and column block `n_block`;
  // consumer 1's is the next.
  __device__ size_t half(int local_row0, int n_block) const {
    return (size_t(local_row0 / kTileRows) * n_blocks + n_block) * 2 + (local_row0 % kTileRows) / 64;
  }
};

constexpr uint64_t kWaitLimitNs = 10'000'000'000ull;

// How long the kernel's barrier waits may last before it traps: kWaitLimitNs, and with an exchange the
// communicator's timeout more, since any of them may stand behind a wait for a peer, which that timeout bounds.
__device__ __forceinline__ uint64_t wait_limit_ns(const ExchangeView& v) {
  if (v.x.world == 0) return kWaitLimitNs;
  const uint64_t timeout = v.x.pad.timeout_ns;
  return timeout > ~uint64_t(0) - kWaitLimitNs ? ~uint64_t(0) : timeout + kWaitLimitNs;
}

// Waits until `peer` has read what this rank sent it in its previous call (its freed word here reaches stamp - 1),
// before this rank stores into the peer's area; false where the wait gave up (NOTE [stopped ranks]).
__device__ __forceinline__ bool wait_freed(const ExchangeView& v, int peer, uint64_t stamp, Collective collective) {
  return wait_for_word(v.x.pad, v.freed(v.x.local, peer), stamp - 1, collective, kSiteExchangeFreed, peer);
}

// Adds the rows received from the peers beyond the first (slots 1 to world - 2, beyond 2 ranks) to a consumer
// warpgroup's accumulators of this rank's 64 rows from `local_row0` (of its block) and columns from `col0`, in the
// accumulators' own layout, each lane's column pairs read from the exchange area.
template <typename T>
__device__ __forceinline__ void add_further_peers(float (&acc)[128], const Sm90Exchange& x, int n, int local_row0,
                                                  int col0, int tid) {
  const int lane = tid % 32, row = (tid / 32) * 16 + lane / 4;
  const size_t block_elements = x.block_rows * size_t(n);
  const T* received = reinterpret_cast<const T*>(x.local + x.received_offset);
  for (int slot = 1; slot < x.world - 1; ++slot) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const T* source = received + slot * block_elements + size_t(local_row0 + row + 8 * half) * n;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = col0 + 8 * j + 2 * (lane % 4);
        if (col >= n) continue;
        const float2 more = Pack<T>::from(*reinterpret_cast<const uint32_t*>(source + col));
        acc[4 * j + 2 * half] += more.x;
        acc[4 * j + 2 * half + 1] += more.y;
      }
    }
  }
}

// After every block's tiles: the last block to finish stores the stamp as the area's call count and into every
// peer's freed word for this rank, unless the rank is stopped (NOTE [stopped ranks]: it posts nothing more).
// ResetsArrived (kEngineReduceScatter): the last block first resets this rank's arrived flags (NOTE [reduce-scatter
// by the copy engines]).
template <bool ResetsArrived>
__device__ __forceinline__ void finish_exchange(const ExchangeView& v, uint64_t stamp) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  const Sm90Exchange& x = v.x;
  unsigned int* blocks_done = reinterpret_cast<unsigned int*>(x.local + kBlocksDoneOffset);
  __threadfence();
  if (atomicAdd(blocks_done, 1u) != gridDim.x - 1) return;
  *blocks_done = 0;
  if (device::rank_stopped(x.pad)) return;
  if constexpr (ResetsArrived) {
    const int chunks = static_cast<int>((x.block_rows + v.chunk_rows - 1) / v.chunk_rows);
    for (int slot = 0; slot < x.world - 1; ++slot) {
      for (int chunk = 0; chunk < chunks; ++chunk) *v.arrived(x.local, slot, chunk) = 0;
    }
  }
  *v.control(x.local, kCallsOffset) = stamp;
  __threadfence_system();
  for (int peer = 0; peer < x.world; ++peer) {
    if (peer != x.rank) store_release_system(v.freed(x.peers[peer], x.rank), stamp);
  }
}

}  // namespace
}  // namespace braid::kernels

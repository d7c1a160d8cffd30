// braid's Hopper GEMM (matmul_sm90.cu), its reduce-scatter in the epilogue: the staging buffers, the consumers'
// stores of own and peer tiles, and the store warp. Included by matmul_sm90.cu alone, whose anonymous namespace its
// pieces join.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "kernels/collective_id.hpp"
#include "kernels/matmul_sm90.hpp"
#include "kernels/matmul_sm90_epilogue.cuh"
#include "kernels/matmul_sm90_exchange.cuh"
#include "kernels/matmul_sm90_layout.hpp"
#include "kernels/matmul_sm90_pipeline.cuh"
#include "kernels/matmul_sm90_shape.cuh"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

// NOTE [reduce-scatter in the epilogue]
// With an exchange (Sm90Exchange), each rank computes every row of A x B^T and reduce-scatters the product by rows
// as it goes, in one launch, with no copy kernel, meeting or side stream:
//   - Order: the schedule runs over rows rotated by rank + 1 blocks, so a rank computes the blocks its peers own
//     first (rank + 1's first) and its own last: the peers' rows travel while its own still compute.
//   - Each consumer warpgroup has a staging buffer in shared memory (64 rows x 256 columns, in the TMA's 128-byte
//     swizzle; the kernel keeps 3 stages instead of 4 to make room), which it and a warp of the producer warpgroup,
//     the store warp, hand to each other once a tile (barriers to_store and to_consumer).
//   - A peer's tile: the consumers round their rows into the staging buffers and go on to their next tile; stores
//     across NVLink from their registers would hold the multiplications up. The store warp has the copy engine store
//     them (TMA tensor stores of 64 columns, through a tensor map of the peer's area: ExchangeMaps) into the peer's
//     exchange area, in its received block for this rank, waits until the stores are performed, fences at system
//     scope and stores the call's stamp into the peer's flags for the tile's two halves.
//   - An own tile: while the consumers still multiply, the store warp waits until every peer's flags for it hold the
//     stamp and has the copy engine load the first peer's rows into the staging buffers (TMA tensor loads of 64
//     columns); the consumers add any further peers' rows (read from the area) and those to their accumulators, in
//     float32 and in the accumulators' own layout, and store alpha x the sum to D as the plain GEMM stores.
//   - The store warp releases a peer tile's flags before it waits for any flag of the next tile, so no flag of one
//     rank waits for a flag of another.
//   - Stamps: the area's call count + 1, read by every block at its start. The last block to finish stores it back,
//     then writes it into every peer's freed word for this rank: "this rank has read what you sent, up to this call".
//     Before its first copy into a peer's area, the store warp waits for that peer's freed word to reach the previous
//     stamp, so a call never overwrites rows the peer's previous call still reads.
//   - Words only grow, so back-to-back calls and graph replays need no reset; an area is zeroed when made (on every
//     rank together, so their counts agree), and its flags never move while it lives.
// No wait depends on a block that may not be resident: a rank's own half-tiles wait for its peers' blocks only, and
// those wait only for the peers' previous launches. Every wait for a peer is bounded by the communicator's timeout
// and ends on a failure in its fatal word (device::spin_until: a timeout is recorded there, for the host to raise
// at the next call); a lane that gave up, and every lane of a launch that started on a stopped rank, stores nothing
// into a peer's area and releases no flag, and the last block then leaves the call count and freed words as they
// were (NOTE [stopped ranks]). verify/models/epilogue_exchange.pml checks the protocol.

// A staging buffer holds a warpgroup's 64 rows x 256 columns as the copy engine moves them: 4 boxes of 64 columns
// (kStagingBoxBytes each), each 64 rows of 128 bytes in the TMA's 128-byte swizzle (the 16-byte chunk c of row r at
// chunk c ^ (r % 8)), so that the lanes' accesses below spread over the banks.
constexpr int kStagingBoxCols = 64;
static_assert(kStagingBoxCols == kTileK, "a staging box is the tensor maps' box of 64 columns");
constexpr uint32_t kStagingBoxBytes = 64 * kStagingBoxCols * 2;
// The byte of the staging buffer where row `row`'s group `group` of 8 columns starts.
__device__ __forceinline__ uint32_t staged_group(int row, int group) {
  return (group / 8) * kStagingBoxBytes + row * 128 + (((group % 8) ^ (row % 8)) * 16);
}

// Rounds a consumer warpgroup's 64 rows into its staging buffer, each lane 16 bytes a row and group of 8 columns
// after the quad transpose, as store_tile's plain path stores them to D.
template <typename T>
__device__ __forceinline__ void stage_rows(const float (&acc)[128], uint8_t* staging, int tid) {
  const int lane = tid % 32;
  const int row = (tid / 32) * 16 + lane / 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int g = 0; g < 32; g += 4) {
      *reinterpret_cast<uint4*>(staging + staged_group(row + 8 * half, g + lane % 4)) = rounded_group<T>(acc, half, g, lane);
    }
  }
}

// A consumer warpgroup's 64 rows from `row0` (of A's rows) and columns from n_block * 256 of a tile this rank owns:
// alpha x (product + the received rows, added in float32) into D (NOTE [reduce-scatter in the epilogue]). The
// received rows are added in the accumulators' own layout, each lane's column pairs read from the exchange area
// (further peers', beyond 2 ranks) and then from the staging buffer (the first peer's), so the store is
// store_tile's plain path.
template <typename T>
__device__ __forceinline__ void store_own_rows(float (&acc)[128], const ExchangeView& v, const Epilogue& e, int row0,
                                               int n_block, const uint8_t* staging, int tid) {
  const Sm90Exchange& x = v.x;
  const int lane = tid % 32, row = (tid / 32) * 16 + lane / 4;
  const int local_row0 = row0 - x.rank * static_cast<int>(x.block_rows), col0 = n_block * kTileCols;
  add_further_peers<T>(acc, x, e.n, local_row0, col0, tid);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float2 c =
          Pack<T>::from(*reinterpret_cast<const uint32_t*>(staging + staged_group(row + 8 * half, j) + (lane % 4) * 4));
      acc[4 * j + 2 * half] = e.alpha * (acc[4 * j + 2 * half] + c.x);
      acc[4 * j + 2 * half + 1] = e.alpha * (acc[4 * j + 2 * half + 1] + c.y);
    }
  }
  const Epilogue out{e.d, nullptr, 1.0f, 0.0f, static_cast<int>(x.block_rows), e.n};
  store_tile<T>(acc, out, local_row0, col0, tid);
}

// The store warp (NOTE [reduce-scatter in the epilogue]). It takes the block's tiles in the consumers' order; at each,
// once both consumers have handed their staging buffers back:
//   1. the previous tile's, if a peer's: copies both staged halves into the peer's received block for this rank,
//      waits until the copies are performed, and releases the halves' flags in the peer's area;
//   2. this tile, if this rank's own: waits for every peer's flags for it, then has the copy engine load the first
//      peer's rows into the staging buffers, completing the consumers' barriers; if a peer's: hands the buffers
//      over as they are.
template <typename T>
__device__ __forceinline__ void exchange_tiles(const ExchangeView& v, const ExchangeMaps& maps, const Schedule& schedule,
                                               uint32_t block, int first_unit, int unit_step, uint8_t* staging,
                                               uint64_t* to_store, uint64_t* to_consumer, int n, uint64_t stamp,
                                               bool stopped, int lane) {
  const Sm90Exchange& x = v.x;
  const int block_rows = static_cast<int>(x.block_rows);
  const int units = schedule.m_units * schedule.n_blocks;
  // stopped: this lane gave the call up, or the rank was stopped when the launch started: it stores nothing into
  // a peer's area and waits for nothing, but still hands the buffers back (NOTE [stopped ranks]).
  uint64_t cleared = 0;  // the peers whose freed word this lane has seen
  uint32_t handoffs = 0;
  int sent_owner = -1, sent_row0 = 0, sent_n_block = 0;  // the previous tile, where a peer's
  auto send_previous = [&] {
    const int owner = sent_owner, slot = v.slot_of(x.rank, owner);
    uint8_t* peer = x.peers[owner];
    if (lane < 2 && !stopped && !((cleared >> owner) & 1)) {
      stopped = !wait_freed(v, owner, stamp, Collective::kMatmulReduceScatter);
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's stores after the acquire
      cleared |= uint64_t(1) << owner;
    }
    if (lane < 2 && !stopped) {  // lane h: half h; columns past n are not stored
      for (int box = 0; box < kTileCols / kStagingBoxCols; ++box) {
        const int col = sent_n_block * kTileCols + box * kStagingBoxCols;
        if (col < n) {
          tma_store(&maps.peers[owner], col, slot * block_rows + sent_row0 + 64 * lane,
                    staging + lane * kStagingBytes + box * kStagingBoxBytes);
        }
      }
      bulk_stores_complete();
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's stores before the flag
      __threadfence_system();
      store_release_system(v.flag(peer, slot, v.half(sent_row0, sent_n_block) + lane), stamp);
    }
    __syncwarp();
    sent_owner = -1;
  };
  const auto wait_limit = [&] { return wait_limit_ns(v); };
  auto buffers_back = [&] {  // both consumers have handed their buffers back after their previous tile
    barrier_wait(&to_store[0], (handoffs & 1) ^ 1, wait_limit);
    barrier_wait(&to_store[1], (handoffs & 1) ^ 1, wait_limit);
  };
  for (int u = first_unit; u < units; u += unit_step) {
    int m_block, n_block;
    schedule.unit(u, m_block, n_block);
    m_block = v.rotate(m_block + block);
    if (m_block >= v.m_blocks) continue;  // the second block of a cluster past the last row: the consumers skip it
    buffers_back();
    if (sent_owner >= 0) send_previous();
    const int row0 = m_block * kTileRows, owner = row0 / block_rows, local_row0 = row0 - owner * block_rows;
    if (owner == x.rank) {
      const size_t half = v.half(local_row0, n_block);
      for (int slot = 0; lane < 2 && !stopped && slot < x.world - 1; ++slot) {
        const int sender = (x.rank + slot + 1) % x.world;  // slot_of(sender, rank) == slot
        stopped = !wait_for_word(x.pad, v.flag(x.local, slot, half + lane), stamp, Collective::kMatmulReduceScatter,
                                 kSiteExchangeRows, sender);
      }
      if (lane < 2 && stopped) {
        barrier_arrive(&to_consumer[lane]);  // the consumer adds whatever the buffer holds: the call is given up
      } else if (lane < 2) {  // lane h: half h, whose flags it waited for itself; columns past n arrive as zeros
        asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's load after the acquire
        barrier_expect_bytes(&to_consumer[lane], kStagingBytes);
        for (int box = 0; box < kTileCols / kStagingBoxCols; ++box) {  // a box past n arrives as zeros
          tma_load(staging + lane * kStagingBytes + box * kStagingBoxBytes, &maps.received,
                   n_block * kTileCols + box * kStagingBoxCols, local_row0 + 64 * lane, &to_consumer[lane]);
        }
      }
    } else {
      if (lane == 0) {
        barrier_arrive(&to_consumer[0]);
        barrier_arrive(&to_consumer[1]);
      }
      sent_owner = owner;
      sent_row0 = local_row0;
      sent_n_block = n_block;
    }
    ++handoffs;
  }
  buffers_back();
  if (sent_owner >= 0) send_previous();
}

}  // namespace
}  // namespace braid::kernels

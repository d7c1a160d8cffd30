// braid's Hopper GEMM (matmul_sm90.cu), its all-gather under the loads: the gather warp, which sends this rank's
// rows of A to its peers and copies the received rows into the gathered A (the producer's waits for them are in the
// kernel). Included by matmul_sm90.cu alone, whose anonymous namespace its pieces join.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/collective_id.hpp"
#include "kernels/matmul_sm90.hpp"
#include "kernels/matmul_sm90_exchange.cuh"
#include "kernels/matmul_sm90_layout.hpp"
#include "kernels/matmul_sm90_pipeline.cuh"
#include "kernels/matmul_sm90_shape.cuh"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

// NOTE [all-gather under the loads]
// With an exchange of kind kAllGather, each rank multiplies the gathered A, every rank's block of rows, by B^T in
// one launch, as the rows arrive, with no copy kernel, meeting or side stream:
//   - Order: the schedule runs over rows rotated by rank blocks, so a rank multiplies its own block first (read
//     from its A where it is) while its peers' blocks travel.
//   - Sending: a warp of the producer warpgroup, the gather warp, copies this rank's rows into every peer's
//     exchange area (its received block for this rank) in pieces of 128 rows x kGatherPieceSteps steps of K: the
//     copy engine loads a box of 128 rows x 64 columns into one of two slots in shared memory and stores it to
//     every peer (TMA tensor copies through tensor maps of the peers' areas: ExchangeMaps), and into the gathered
//     A where one is asked for. Once a piece's stores are performed, it fences at system scope and stores the
//     call's stamp into each peer's flag for the piece. The pieces go round the blocks of the grid, so all of them
//     send at once.
//   - Loading: the producer, before the first step of a peer's piece in a tile, waits until its flag holds the
//     stamp, then has the copy engine load the step from the received block as it loads its own rows from A.
//   - The gathered A (where asked for): after their pieces, the gather warps wait for the peers' flags in turn and
//     copy the received pieces into it.
//   - Stamps and freed words as in the reduce-scatter: the last block to finish stores the stamp as the area's
//     call count and into every peer's freed word for this rank, and the gather warp waits for a peer's freed word
//     to reach the previous stamp before its first store into that peer's area.
// No wait depends on a block that may not be resident: the producers wait for the peers' gather warps, which wait
// only for the peers' previous launches; the waits are bounded and end on a failure as the reduce-scatter's do, and
// a producer that gave up loads on without waiting, so its consumers finish (NOTE [stopped ranks]).
// verify/models/loads_gather.pml checks the protocol.

// The gather warp of an all-gather (NOTE [all-gather under the loads]); lane 0 works. Its block takes every
// gridDim.x-th item: first the pieces of this rank's block, which it sends to every peer (and into the gathered A),
// then, where a gathered A is asked for, the pieces received from the peers, which it copies there.
__device__ __forceinline__ void gather_rows(const ExchangeView& v, const ExchangeMaps& maps, const CUtensorMap* shard,
                                            uint8_t* slots, uint64_t* loaded, int k_steps, uint64_t stamp,
                                            bool stopped, int lane) {
  if (lane != 0) return;
  const Sm90Exchange& x = v.x;
  const int block_rows = static_cast<int>(x.block_rows);
  const int sends = block_rows / kTileRows * v.pieces;
  const int items = x.gathered == nullptr ? sends : x.world * sends;
  uint32_t uses = 0;  // boxes through the slots so far
  // A box into the next slot from `from` at (col, row), then `store` of the slot as one bulk group. The slot's
  // previous stores, two boxes back, must have read it first.
  auto copy_box = [&](const CUtensorMap* from, int col, int row, auto&& store) {
    const uint32_t s = uses % 2;
    uint8_t* slot = slots + s * kATileBytes;
    if (uses >= 2) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    barrier_expect_bytes(&loaded[s], kATileBytes);
    tma_load(slot, from, col, row, &loaded[s]);
    barrier_wait(&loaded[s], (uses / 2) & 1, [&] { return wait_limit_ns(v); });
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    store(slot);
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    ++uses;
  };
  uint64_t cleared = 0;  // the peers whose freed word this lane has seen
  for (int item = blockIdx.x; item < items && !stopped; item += gridDim.x) {
    const int source = item / sends, index = item % sends;  // source 0: this rank's block; s: received slot s - 1
    const int row = index / v.pieces * kTileRows, piece = index % v.pieces;
    const int first_box = piece * kGatherPieceSteps, last_box = min(k_steps, first_box + kGatherPieceSteps);
    if (source == 0) {
      for (int i = 1; i < x.world && !stopped; ++i) {
        const int peer = (x.rank + i) % x.world;
        if ((cleared >> peer) & 1) continue;
        stopped = !wait_freed(v, peer, stamp, Collective::kAllGatherMatmul);
        cleared |= uint64_t(1) << peer;
      }
      if (stopped) break;
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's stores after the acquires
      for (int box = first_box; box < last_box; ++box) {
        copy_box(shard, box * kTileK, row, [&](const uint8_t* slot) {
          for (int i = 1; i < x.world; ++i) {
            const int peer = (x.rank + i) % x.world;
            tma_store(&maps.peers[peer], box * kTileK, v.slot_of(x.rank, peer) * block_rows + row, slot);
          }
          if (x.gathered != nullptr) tma_store(&maps.gathered, box * kTileK, x.rank * block_rows + row, slot);
        });
      }
      bulk_stores_complete();
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's stores before the flags
      __threadfence_system();
      for (int i = 1; i < x.world; ++i) {
        const int peer = (x.rank + i) % x.world;
        store_release_system(v.flag(x.peers[peer], v.slot_of(x.rank, peer), index), stamp);
      }
    } else {
      const int slot = source - 1, sender = (x.rank + slot + 1) % x.world;  // slot_of(sender, rank) == slot
      stopped = !wait_for_word(x.pad, v.flag(x.local, slot, index), stamp, Collective::kAllGatherMatmul,
                               kSiteGatheredRows, sender);
      if (stopped) break;
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the copy engine's loads after the acquire
      for (int box = first_box; box < last_box; ++box) {
        copy_box(&maps.received, box * kTileK, slot * block_rows + row, [&](const uint8_t* slot_bytes) {
          tma_store(&maps.gathered, box * kTileK, sender * block_rows + row, slot_bytes);
        });
      }
    }
  }
  bulk_stores_complete();  // every store performed (and the slots read) before the block ends
}

}  // namespace
}  // namespace braid::kernels

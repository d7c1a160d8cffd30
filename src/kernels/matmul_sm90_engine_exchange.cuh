// braid's Hopper GEMM (matmul_sm90.cu), its reduce-scatter by the copy engines: the consumers' stores of own and
// peer tiles (the gate and post kernels, and their launches, are in matmul_sm90.cu). Included by matmul_sm90.cu
// alone, whose anonymous namespace its pieces join.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/collective_id.hpp"
#include "kernels/matmul_sm90.hpp"
#include "kernels/matmul_sm90_epilogue.cuh"
#include "kernels/matmul_sm90_exchange.cuh"
#include "kernels/matmul_sm90_layout.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

// NOTE [reduce-scatter by the copy engines]
// With an exchange of kind kEngineReduceScatter, each rank computes every row of A x B^T in one launch of the plain
// kernel's shape (4 stages, no staging buffers), while the copy engines carry the peers' rows, driven from a stream
// of the caller's (kernels/matmul_sm90.hpp says what it enqueues):
//   - Order: as the epilogue reduce-scatter's, the blocks the peers own first (rank + 1's first), this rank's last.
//   - A peer's tile: the consumers store it as the plain GEMM does, unscaled and rounded, into this rank's products
//     for that peer (an area block), then each warp adds one to the ready count of the tile's chunk of rows.
//   - The gate (one thread on the caller's stream) waits until a chunk's count reaches one a warp and tile of the
//     chunk, then resets it; the copy engine then copies the chunk into the peer's received block for this rank,
//     and the post stores 1 into the peer's arrived flag for (this rank, chunk).
//   - An own tile: lane 0 of each warp waits until every peer's arrived flag for the tile's chunk is set; the warp
//     adds any further peers' rows (beyond 2 ranks) to its accumulators, then stores alpha x (product + the first
//     peer's rows, read as C) as the plain GEMM stores with C.
//   - The last block to finish resets this rank's arrived flags (every own tile has seen them) and advances the
//     call count and the peers' freed words as the other kinds do, so an epilogue or all-gather call after this
//     one waits for the peers to have read what this one sent.
// The copies into a peer's received block start only after a meeting of the ranks that every peer's previous call
// has ended (the caller's), so they never overwrite rows a previous call still reads; a chunk's count and flag
// return to 0 within the call, so back-to-back calls and graph replays need no reset. The gate and the own tiles'
// waits are bounded by the communicator's timeout and end on a failure (NOTE [stopped ranks]): a stopped rank posts
// no flag, and its last block leaves the words as they were.

// A consumer warpgroup's 64 rows from `row0` (of A's rows) and columns from n_block * 256 with kEngineReduceScatter
// (NOTE [reduce-scatter by the copy engines]). A peer's rows: stored, unscaled, into this rank's products for that
// peer, then counted ready (a count a warp). This rank's own: once every peer's chunk has arrived, alpha x (product
// + the peers' rows) into D, the first peer's rows read as C. `stopped`: this lane gave the call up, or the rank was
// stopped when the launch started; it waits for nothing more.
template <typename T>
__device__ __forceinline__ void store_engine_rows(float (&acc)[128], const ExchangeView& v, const Epilogue& e,
                                                  int row0, int n_block, bool& stopped, int tid) {
  const Sm90Exchange& x = v.x;
  const int lane = tid % 32, block_rows = static_cast<int>(x.block_rows);
  const int owner = row0 / block_rows, local_row0 = row0 - owner * block_rows, col0 = n_block * kTileCols;
  const int chunk = local_row0 / v.chunk_rows;
  const size_t block_elements = x.block_rows * size_t(e.n);
  const T* received = reinterpret_cast<const T*>(x.local + x.received_offset);
  if (owner != x.rank) {
    const int destination = (owner - x.rank - 1 + x.world) % x.world;
    T* products = const_cast<T*>(received) + (size_t(x.world - 1) + destination) * block_elements;
    store_tile<T>(acc, Epilogue{products, nullptr, 1.0f, 0.0f, block_rows, e.n}, local_row0, col0, tid);
    __syncwarp();
    if (lane == 0) {
      __threadfence();  // the warp's stores before its count: the gate, then the copy engine, read them
      atomicAdd(reinterpret_cast<unsigned long long*>(v.ready(x.local, destination, chunk)), 1ull);
    }
    return;
  }
  if (lane == 0) {
    for (int slot = 0; slot < x.world - 1 && !stopped; ++slot) {
      const int sender = (x.rank + 1 + slot) % x.world;  // slot_of(sender, rank) == slot
      stopped = !wait_for_word(x.pad, v.arrived(x.local, slot, chunk), 1, Collective::kMatmulReduceScatter,
                               kSiteExchangeRows, sender);
    }
  }
  __syncwarp();
  add_further_peers<T>(acc, x, e.n, local_row0, col0, tid);
  store_tile<T>(acc, Epilogue{e.d, received, e.alpha, e.alpha, block_rows, e.n}, local_row0, col0, tid);
}

}  // namespace
}  // namespace braid::kernels

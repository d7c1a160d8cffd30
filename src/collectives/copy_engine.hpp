// Collectives by copy engines on buffers every peer maps: cudaMemcpyAsync copies between two one-block barrier
// kernels, so no kernel sits on the NVLink data path (an engine moves more over a link than SM stores:
// docs/dev/collectives.md). The entry barrier: every peer reached the call (its input is written, its output no
// longer in use). The exit barrier: every copy into or out of this rank's buffers has completed before its stream
// goes on. Both announce `plan`. Peers go in rotated order (rank + 1, ...), so at each step every GPU serves one
// copy. Other reductions than below have none: pulls into staging lost (docs/dev/selection.md). Not for another
// GPU's cudaMalloc memory of this process (PeerRange::same_process_peers): callers take SM kernels there.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"
#include "memory/peer_range.hpp"

namespace braid::collectives {

struct CollectiveContext;

// This rank's own block: an SM kernel of at most 16 blocks on the side stream `stream`, beside the engines'
// copies (it need only finish before them; fewer blocks take less of the HBM bandwidth they write into).
void copy_own_block(const CollectiveContext& state, void* destination, const void* source, size_t bytes,
                    cudaStream_t stream);

// Block q of this rank's input lands in block `rank` of rank q's output; out of place.
void all_to_all_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t block_bytes,
                            uint64_t plan, Stream stream);
// The same by pulls, for the one-sided all-to-all, whose outputs no peer maps (pushes move more).
void all_to_all_pull_copy_engine(CollectiveContext& state, const PeerBuffers& send, void* recv, size_t block_bytes,
                                 uint64_t plan, Stream stream);
// Block q of each rank's buffer swaps places with block `rank` of rank q's; 2 ranks, in place (NOTE [all-to-all in
// place by the copy engines], copy_engine.cpp).
void all_to_all_in_place_copy_engine(CollectiveContext& state, const PeerBuffers& buffers, size_t block_bytes,
                                     uint64_t plan, Stream stream);
// `bytes` of this rank's input land at rank × bytes of every rank's output (in place when send is there).
void all_gather_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes,
                            uint64_t plan, Stream stream);
// The halves of `bytes` that each of 2 ranks owns in the engines' all-reduce and all-to-all in place: rank 0 the
// first, split at a 256-byte boundary (no element straddles it), rank 1 the rest; the same on both ranks.
struct PairHalves {
  size_t own_offset, own_bytes, peer_offset, peer_bytes;
  size_t larger() const { return own_bytes > peer_bytes ? own_bytes : peer_bytes; }
};
PairHalves pair_halves(size_t bytes, int rank);

// Both ranks' inputs, reduced, land in both outputs (copy_engine_push_reduce.cpp); 2 ranks, out of place.
// In place instead: all_reduce_in_place_copy_engine.
void all_reduce_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes,
                            DataType type, ReduceOp op, uint64_t plan, Stream stream);
// Block q of both ranks' inputs, reduced, lands in rank q's output; 2 ranks, out of place.
void reduce_scatter_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv,
                                size_t block_bytes, DataType type, ReduceOp op, uint64_t plan, Stream stream);
// The root's `bytes` land in every rank's output; the other ranks only pass the barriers.
void broadcast_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes, int root,
                           uint64_t plan, Stream stream);

}  // namespace braid::collectives

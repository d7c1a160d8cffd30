// Collectives by copy engines on buffers every peer maps (symmetric allocations, registered buffers): the host
// enqueues cudaMemcpyAsync copies between two one-block barrier kernels, so no kernel sits on the NVLink data
// path (a copy engine moves more over a link than SM stores do). The entry barrier: every peer reached the call
// (its input is written, its output no longer in use). The exit barrier: every copy into or out of this rank's
// buffers has completed before its stream goes on.
//
// Who copies, and from where to where:
//   - all-to-all: pushes block q of this rank's input into block `rank` of every peer q's output (needs the
//     outputs mapped); the one-sided all-to-all, whose outputs no peer maps, pulls block `rank` of every peer's
//     input instead (needs the inputs mapped). Pushes move more: with both directions of a link busy, the
//     engines push about 388 GB/s each way and pull about 371 (docs/dev/collectives.md);
//   - all-gather, broadcast: push this rank's input into every peer's output (needs the outputs mapped).
//   - all-reduce, 2 ranks, out of place: pushes the peer's half of this rank's input into the peer's output,
//     where the peer's SMs reduce it with the peer's own input, and then pushes this rank's reduced half into the
//     peer's output (copy_engine_push_reduce.cpp: in chunks, with a post per chunk between the barriers);
//   - reduce-scatter, 2 ranks, out of place: pushes the peer's block of this rank's input into the peer's output,
//     where the peer's SMs reduce it with the peer's own block (the same file, the same steps but the push back).
// Other reductions have none here: pulls into staging and a local reduction are slower than the zero-copy loads
// (docs/dev/selection.md). On outputs no peer maps, reduce-scatter's copy engines push into the peer's pipeline
// area instead (copy_engine_pairs.hpp).
// Peers are visited in a rotated order (rank + 1, rank + 2, ...), so at each step every GPU serves one copy.
// This rank's own block is copied by an SM kernel on the communicator's side stream, beside the peers' copies.
//
// `plan` (collectives/plan.hpp) is announced at both barriers, so ranks that disagree on the call stop there.
//
// Not for another GPU's cudaMalloc memory of this process (PeerRange::same_process_peers): callers take SM
// kernels there.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"
#include "memory/peer_range.hpp"

namespace braid::collectives {

struct CollectiveContext;

// This rank's own block of a copy-engine collective: an SM kernel of at most 16 blocks on `stream`, a side stream
// where it runs beside the engines' copies (it needs only to finish before them, and takes less of the HBM
// bandwidth they write into with fewer blocks).
void copy_own_block(const CollectiveContext& state, void* destination, const void* source, size_t bytes,
                    cudaStream_t stream);

// Uniform blocks of `block_bytes`: block q of this rank's input lands in block `rank` of rank q's output (out of
// place only: a peer's output must not be its input). By pushes.
void all_to_all_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t block_bytes,
                            uint64_t plan, Stream stream);
// The same exchange by pulls, for the one-sided all-to-all: block q of this rank's output comes from block `rank`
// of rank q's input.
void all_to_all_pull_copy_engine(CollectiveContext& state, const PeerBuffers& send, void* recv, size_t block_bytes,
                                 uint64_t plan, Stream stream);
// `bytes` of this rank's input land at rank × bytes of every rank's output (in place when send is there).
void all_gather_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes,
                            uint64_t plan, Stream stream);
// The reduction of both ranks' `bytes` of input lands in both outputs (recv.at[rank] is this rank's); 2 ranks, out
// of place.
void all_reduce_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes,
                            DataType type, ReduceOp op, uint64_t plan, Stream stream);
// Blocks of `block_bytes`: block q of the input of both ranks, reduced, lands in rank q's output (recv.at[q]);
// 2 ranks, out of place.
void reduce_scatter_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv,
                                size_t block_bytes, DataType type, ReduceOp op, uint64_t plan, Stream stream);
// The root's `bytes` land in every rank's output; the other ranks only pass the barriers.
void broadcast_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes, int root,
                           uint64_t plan, Stream stream);

}  // namespace braid::collectives

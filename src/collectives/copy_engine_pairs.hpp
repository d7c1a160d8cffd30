// Collectives on buffers no peer maps, moved as send/recv's copy-engine pairs: chunks into the receiver's
// pipeline area, copied out there by SMs. A rank's k-th send goes to rank + k and its k-th receive comes from
// rank - k, so every k-th send meets its receiver's k-th receive and no pair waits on a later one. An entry
// barrier announces the plan. All-to-all runs out of place only (its pairs read blocks the receives overwrite).
// All-reduce on more than 2 ranks is a reduce-scatter's pairs and then an all-gather's.
// Reduce-scatter and reduce reduce each chunk on arrival, in place too: each own element is read before the same
// thread writes it. Reduce-scatter serves any world, a rounding per receive (NOTE [reduction pairs on more than 2
// ranks] in send_recv.cpp); reduce 2 ranks. All-reduce in place on 2 ranks whose buffers the peer maps sends
// its first pushes as pairs and the reduced chunks into the peer's buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"
#include "kernels/send_recv_bulk_launch.hpp"
#include "memory/peer_range.hpp"

namespace braid::collectives {

struct CollectiveContext;

kernels::BulkLayout bulk_layout(const CollectiveContext& state);

void all_to_all_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t block_bytes,
                                  uint64_t plan, Stream stream);
// `bytes` of this rank's input land at rank × bytes of every rank's output.
void all_gather_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, uint64_t plan,
                                  Stream stream);
// Blocks of `block_bytes`.
void reduce_scatter_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t block_bytes,
                                      DataType type, ReduceOp op, uint64_t plan, Stream stream);
// `count` elements: a reduce-scatter's pairs of balanced blocks (rank r's block starts at element count * r / size),
// each rank's block reduced into its part of the output, then an all-gather's pairs of the reduced blocks, in
// place in the output. Two entry barriers, one per phase. In place too: a rank's phase-one sends read only the
// other blocks of its input, which its own phase two overwrites after them. state.size must be more than 2.
void all_reduce_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t count, DataType type,
                                  ReduceOp op, uint64_t plan, Stream stream);
// 2 ranks, in place, on buffers the peer maps: each half's first pushes as pairs into the peer's pipeline area,
// reduced there in place, then pushed into the peer's buffer (NOTE [all-reduce in place by the copy engines]).
void all_reduce_in_place_copy_engine(CollectiveContext& state, const PeerBuffers& buffers, size_t bytes,
                                     DataType type, ReduceOp op, uint64_t plan, Stream stream);
// The other rank's output is not written. state.size must be 2.
void reduce_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, DataType type,
                              ReduceOp op, int root, uint64_t plan, Stream stream);
void broadcast_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, int root,
                                 uint64_t plan, Stream stream);

}  // namespace braid::collectives

// Collectives on buffers no peer maps, moved by copy engines as send/recv's large pairs are (send_recv.cpp,
// send_recv_bulk_launch.hpp): each pair's bytes go as chunks from this rank's buffer into the receiver's pipeline
// area, where SMs copy them out into the receiver's buffer. Rank order of the steps: a rank's k-th send goes to
// rank + k and its k-th receive comes from rank - k, so the k-th send of every rank meets the k-th receive of its
// receiver and no pair waits on a later one. This rank's own block is copied by SMs on the communicator's fourth
// stream beside the pairs. An entry barrier first announces the call's plan, so a peer that planned the call
// otherwise fails with kMismatch, as with the other barrier kernels.
//   - all-to-all: block q of the input to rank q, block q of the output from rank q;
//   - all-gather: the input to every rank, block q of the output from rank q;
//   - broadcast: the root's input to every rank (its sends go one after another, hence the table's 2 ranks);
//   - reduce-scatter, 2 ranks: block q of the input to rank q, reduced there with the receiver's own block into
//     its output as each chunk arrives (send_recv_bulk_reduce.cu);
//   - reduce, 2 ranks: the other rank's input to the root, reduced there with the root's own input the same way.
//   On more ranks the output of these two would hold partial results, rounded to the datatype, between one peer's
//   data and the next, so the planner keeps them to 2.
// Out of place for all-to-all (its pairs read blocks the receives overwrite); all-gather and broadcast in place
// too (the own block is then where it belongs already), and reduce-scatter and reduce (each element of the own
// data is read before the same thread writes its result there).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/types.hpp"
#include "kernels/send_recv_bulk_launch.hpp"

namespace braid::collectives {

struct CollectiveContext;

// Where the copy-engine chunks' slots and headers lie in every rank's pipeline area (send_recv_bulk_launch.hpp).
kernels::BulkLayout bulk_layout(const CollectiveContext& state);

void all_to_all_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t block_bytes,
                                  uint64_t plan, Stream stream);
// `bytes` of this rank's input land at rank × bytes of every rank's output.
void all_gather_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, uint64_t plan,
                                  Stream stream);
// Blocks of `block_bytes`; state.size must be 2.
void reduce_scatter_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t block_bytes,
                                      DataType type, ReduceOp op, uint64_t plan, Stream stream);
// The root's output receives the reduction; the other rank's output is not written. state.size must be 2.
void reduce_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, DataType type,
                              ReduceOp op, int root, uint64_t plan, Stream stream);
void broadcast_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, int root,
                                 uint64_t plan, Stream stream);

}  // namespace braid::collectives

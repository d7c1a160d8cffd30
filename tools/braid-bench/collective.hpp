// The collectives as braid-bench sees them (sendrecv: nccl-tests' sendrecv, each rank sending to the next rank
// and receiving from the previous one in one batch): names, nccl-tests' sizing rules (what the "size" and
// "count" columns mean, where an in-place call's send or receive buffer sits), bus-bandwidth factors, and
// one call into braid. Shared by the benchmark loop, the reference check and the NCCL comparison, so the
// three agree on every buffer offset.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "braid/braid.hpp"

namespace braid::bench {

enum class Collective { kAllReduce, kReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll, kSendRecv };
constexpr Collective kAllCollectives[] = {Collective::kAllReduce, Collective::kReduce,    Collective::kReduceScatter,
                                          Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll,
                                          Collective::kSendRecv};

const char* collective_name(Collective coll);  // "allreduce", ... (the --coll spelling)
bool has_op(Collective coll);                   // reduces (takes a ReduceOp)
bool has_root(Collective coll);                 // reduce, broadcast
// Has an in-place form: every collective but sendrecv (alltoall in place takes recv == send, as ncclAlltoAll
// does; a send and a receive of one batch on one buffer have no defined result).
bool has_in_place(Collective coll);
// Has an in-place form in NCCL: NCCL defines in place for the reductions, broadcast, all-gather and
// reduce-scatter only (its all-to-all on one buffer returns wrong elements), so --compare nccl runs no in-place
// alltoall.
bool nccl_has_in_place(Collective coll);

// Element sizes, names and kinds come from braid/types.hpp (datatype_size, datatype_name, is_floating,
// reduce_op_name).
bool is_signed_int(DataType type);

// One row's buffers, in elements, as nccl-tests defines them for a size in bytes (count = bytes / element
// size): allreduce, reduce, broadcast move `count` elements; allgather's size is the total received
// (send_count = count / ranks per rank); reducescatter's size is the total sent (recv_count = count / ranks);
// alltoall's size is what each rank sends in total, and its count is per peer (count / ranks elements to each
// rank: send_count = recv_count = (count / ranks) * ranks); sendrecv moves `count` elements to the next rank.
struct Shape {
  size_t count = 0;       // the "count" column: the count argument of the call
  size_t send_count = 0;  // elements of each rank's input
  size_t recv_count = 0;  // elements of each rank's output
  size_t bytes = 0;       // the "size" column: max(send, recv) bytes actually moved per rank
  // In place, one buffer of max(send, recv) elements serves both: send and receive pointers sit at these
  // element offsets in it (allgather: the input is the rank's own slot of the output; reducescatter: the
  // output is the rank's own slot of the input; the others: the same pointer).
  size_t in_place_send_offset = 0;
  size_t in_place_recv_offset = 0;
  bool empty() const { return send_count == 0 || recv_count == 0; }
};
Shape shape_of(Collective coll, size_t bytes, DataType type, int ranks, int rank);

// nccl-tests' bus-bandwidth factor: busbw = algbw * factor, algbw = size / time.
double bus_factor(Collective coll, int ranks);

// sendrecv's batch: a send of shape.count elements to the next rank and a receive from the previous one.
std::array<PointToPoint, 2> send_recv_ring(int rank, int ranks, const void* send, void* recv, const Shape& shape,
                                           DataType type);

// Enqueues one call of `coll` on braid with this shape (the count argument each API takes differs).
void call_braid(Communicator& comm, Collective coll, const void* send, void* recv, const Shape& shape, DataType type,
                ReduceOp op, int root, Stream stream);

}  // namespace braid::bench

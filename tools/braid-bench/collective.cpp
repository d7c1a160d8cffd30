#include "collective.hpp"

#include <algorithm>
#include <array>

namespace braid::bench {

const char* collective_name(Collective coll) {
  switch (coll) {
    case Collective::kAllReduce: return "allreduce";
    case Collective::kReduce: return "reduce";
    case Collective::kReduceScatter: return "reducescatter";
    case Collective::kAllGather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kAllToAll: return "alltoall";
    case Collective::kSendRecv: return "sendrecv";
  }
  return "?";
}

bool has_op(Collective coll) {
  return coll == Collective::kAllReduce || coll == Collective::kReduce || coll == Collective::kReduceScatter;
}

bool has_root(Collective coll) { return coll == Collective::kReduce || coll == Collective::kBroadcast; }

bool has_in_place(Collective coll) { return coll != Collective::kSendRecv; }

bool nccl_has_in_place(Collective coll) { return has_in_place(coll) && coll != Collective::kAllToAll; }

bool is_signed_int(DataType type) {
  return type == DataType::kInt8 || type == DataType::kInt32 || type == DataType::kInt64;
}


Shape shape_of(Collective coll, size_t bytes, DataType type, int ranks, int rank) {
  const size_t size = datatype_size(type);
  const size_t count = bytes / size;
  const size_t world = static_cast<size_t>(ranks), me = static_cast<size_t>(rank);
  Shape shape;
  switch (coll) {
    case Collective::kAllReduce:
    case Collective::kReduce:
    case Collective::kBroadcast:
    case Collective::kSendRecv:
      shape.count = shape.send_count = shape.recv_count = count;
      break;
    case Collective::kAllGather:
      shape.count = shape.send_count = count / world;
      shape.recv_count = shape.send_count * world;
      shape.in_place_send_offset = me * shape.send_count;
      break;
    case Collective::kReduceScatter:
      shape.count = shape.recv_count = count / world;
      shape.send_count = shape.recv_count * world;
      shape.in_place_recv_offset = me * shape.recv_count;
      break;
    case Collective::kAllToAll:
      // nccl-tests' alltoall: the count argument is per peer; every rank sends and receives ranks blocks of it.
      shape.count = count / world;
      shape.send_count = shape.recv_count = shape.count * world;
      break;
  }
  shape.bytes = std::max(shape.send_count, shape.recv_count) * size;
  return shape;
}

double bus_factor(Collective coll, int ranks) {
  const double n = ranks;
  switch (coll) {
    case Collective::kAllReduce: return 2.0 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kAllToAll: return (n - 1) / n;
    case Collective::kReduce:
    case Collective::kBroadcast:
    case Collective::kSendRecv: return 1.0;
  }
  return 1.0;
}

void call_braid(Communicator& comm, Collective coll, const void* send, void* recv, const Shape& shape, DataType type,
                ReduceOp op, int root, Stream stream) {
  switch (coll) {
    case Collective::kAllReduce: comm.all_reduce(send, recv, shape.count, type, op, stream); return;
    case Collective::kReduce: comm.reduce(send, recv, shape.count, type, op, root, stream); return;
    case Collective::kReduceScatter: comm.reduce_scatter(send, recv, shape.recv_count, type, op, stream); return;
    case Collective::kAllGather: comm.all_gather(send, recv, shape.send_count, type, stream); return;
    case Collective::kBroadcast: comm.broadcast(send, recv, shape.count, type, root, stream); return;
    case Collective::kAllToAll: comm.all_to_all(send, recv, shape.count, type, stream); return;
    case Collective::kSendRecv: {
      const std::array<PointToPoint, 2> ops = send_recv_ring(comm.rank(), comm.size(), send, recv, shape, type);
      comm.send_recv(ops.data(), ops.size(), stream);
      return;
    }
  }
}

std::array<PointToPoint, 2> send_recv_ring(int rank, int ranks, const void* send, void* recv, const Shape& shape,
                                           DataType type) {
  return {PointToPoint{PointToPoint::kSend, (rank + 1) % ranks, const_cast<void*>(send), shape.count, type},
          PointToPoint{PointToPoint::kRecv, (rank + ranks - 1) % ranks, recv, shape.count, type}};
}

}  // namespace braid::bench

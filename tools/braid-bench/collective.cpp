#include "collective.hpp"

#include <algorithm>

namespace braid::bench {

const char* collective_name(Collective coll) {
  switch (coll) {
    case Collective::kAllReduce: return "allreduce";
    case Collective::kReduce: return "reduce";
    case Collective::kReduceScatter: return "reducescatter";
    case Collective::kAllGather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
  }
  return "?";
}

bool has_op(Collective coll) {
  return coll == Collective::kAllReduce || coll == Collective::kReduce || coll == Collective::kReduceScatter;
}

bool has_root(Collective coll) { return coll == Collective::kReduce || coll == Collective::kBroadcast; }

size_t element_size(DataType type) {
  switch (type) {
    case DataType::kInt8:
    case DataType::kUint8: return 1;
    case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

const char* type_name(DataType type) {
  switch (type) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "float16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBFloat16: return "bfloat16";
  }
  return "?";
}

bool is_float(DataType type) {
  return type == DataType::kFloat16 || type == DataType::kBFloat16 || type == DataType::kFloat32 ||
         type == DataType::kFloat64;
}

bool is_signed_int(DataType type) {
  return type == DataType::kInt8 || type == DataType::kInt32 || type == DataType::kInt64;
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kAvg: return "avg";
  }
  return "?";
}

Shape shape_of(Collective coll, size_t bytes, DataType type, int ranks, int rank) {
  const size_t size = element_size(type);
  const size_t count = bytes / size;
  const size_t world = static_cast<size_t>(ranks), me = static_cast<size_t>(rank);
  Shape shape;
  switch (coll) {
    case Collective::kAllReduce:
    case Collective::kReduce:
    case Collective::kBroadcast:
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
  }
  shape.bytes = std::max(shape.send_count, shape.recv_count) * size;
  return shape;
}

double bus_factor(Collective coll, int ranks) {
  const double n = ranks;
  switch (coll) {
    case Collective::kAllReduce: return 2.0 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllGather: return (n - 1) / n;
    case Collective::kReduce:
    case Collective::kBroadcast: return 1.0;
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
  }
}

}  // namespace braid::bench

// Datatypes and reduction operators of braid's collectives (the NCCL set, NCCL's numbering). Half, bfloat16
// and fp8 reduce in float32 and round once, at the end; except on more than two ranks reduce (to one root), which
// may pass partial results along a chain of the ranks in the datatype and so round after each of its world - 1
// steps, as NCCL's ring does (BRAID_ALGO=reduce=twoshot rounds once there too), and reduce-scatter's and
// all-reduce's copy-engine pairs, which round to the datatype after each peer's block (the table takes
// reduce-scatter's beyond 32 MiB on 3 and 4 ranks where no peer maps the input; else BRAID_ALGO's copyengine).
#pragma once

#include <cstddef>

// cudaStream_t without including CUDA headers: the runtime defines it as exactly this.
struct CUstream_st;

namespace braid {

using Stream = CUstream_st*;  // a cudaStream_t; nullptr is the legacy default stream

enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBFloat16 = 9,
  kFloat8E4M3 = 10,  // OCP fp8: 4 exponent bits, 3 mantissa bits, no infinities (NCCL's ncclFloat8e4m3)
  kFloat8E5M2 = 11,  // OCP fp8: 5 exponent bits, 2 mantissa bits (ncclFloat8e5m2)
};
constexpr int kDataTypeCount = 12;

enum class ReduceOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
constexpr int kReduceOpCount = 5;

size_t datatype_size(DataType type);      // bytes of one element; 0 for a value outside the enum
const char* datatype_name(DataType type);  // "float32", "bfloat16", ...
const char* reduce_op_name(ReduceOp op);   // "sum", ...

// The float16, bfloat16, float32, float64 and fp8 types.
constexpr bool is_floating(DataType type) {
  return type == DataType::kFloat16 || type == DataType::kBFloat16 || type == DataType::kFloat32 ||
         type == DataType::kFloat64 || type == DataType::kFloat8E4M3 || type == DataType::kFloat8E5M2;
}

// The (datatype, op) pairs braid reduces: every op on every datatype. Integers wrap in their own width (sum and
// prod); avg on an integer type divides that sum by the world size, truncating toward zero, as NCCL's ncclAvg
// does. The reducing collectives refuse an op outside ReduceOp (kInvalidArgument naming `op`), and kernels exist
// for the pairs this answers true for.
constexpr bool reduction_supported(DataType type, ReduceOp op) {
  return static_cast<int>(type) >= 0 && static_cast<int>(type) < kDataTypeCount && static_cast<int>(op) >= 0 &&
         static_cast<int>(op) < kReduceOpCount;
}

// One send or receive of a point-to-point batch (Communicator::send_recv).
struct PointToPoint {
  enum Kind : int { kSend = 0, kRecv = 1 };
  Kind kind;
  int peer;      // the other rank (may be this rank: a send to self matches a receive from self in the batch)
  void* buffer;  // kSend: read; kRecv: written
  size_t count;  // elements
  DataType type;
};

}  // namespace braid

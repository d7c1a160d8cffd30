// NCCL's C API, part 2: collectives and point-to-point calls. Each checks its arguments as NCCL does (same
// ncclResult_t), then goes to the group machinery (group.hpp), which runs it on braid or on the real NCCL
// (route.hpp) now or when the caller's group ends.
#include <nccl.h>

#include "core/error.hpp"
#include "group.hpp"
#include "route.hpp"
#include "shim.hpp"
#include "shim_exports.hpp"

using braid::raise_invalid_argument;
using namespace braid::shim;

namespace {

// Which buffers this rank uses, so that only those must be non-null.
enum Uses : unsigned { kSendBuffer = 1, kRecvBuffer = 2 };

ncclResult_t enqueue(const char* function, Op op, unsigned uses, bool reduces, bool rooted) {
  const ncclResult_t checked = guarded(function, [&] {
    const ncclComm& comm = checked_comm(op.comm, function);
    if (op.type < 0 || op.type >= ncclNumTypes) {
      raise_invalid_argument(function, "datatype", "is {}, not an ncclDataType_t", static_cast<int>(op.type));
    }
    if (reduces && (op.op < 0 || op.op >= ncclMaxRedOp)) {
      raise_invalid_argument(function, "op", "is {}, not an ncclRedOp_t", static_cast<int>(op.op));
    }
    if (rooted && (op.root < 0 || op.root >= comm.size)) {
      const bool peer = op.kind == Op::kSend || op.kind == Op::kRecv;
      raise_invalid_argument(function, peer ? "peer" : "root", "is {}, outside [0, {})", op.root, comm.size);
    }
    if (op.count > 0 && (uses & kSendBuffer) && op.send == nullptr) {
      raise_invalid_argument(function, "sendbuff", "is NULL with count {}", op.count);
    }
    if (op.count > 0 && (uses & kRecvBuffer) && op.recv == nullptr) {
      raise_invalid_argument(function, "recvbuff", "is NULL with count {}", op.count);
    }
  });
  if (checked != ncclSuccess) return group_failure(checked);  // NOTE [group failure]
  return submit(op);
}

bool is_root(ncclComm_t comm, int root) {
  return comm != nullptr && comm->magic == ncclComm::kMagic && comm->rank == root;
}

}  // namespace

extern "C" {

SHIM_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
  return enqueue("ncclAllReduce", Op{Op::kAllReduce, comm, sendbuff, recvbuff, count, datatype, op, 0, stream},
                 kSendBuffer | kRecvBuffer, true, false);
}

SHIM_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  return enqueue("ncclReduce", Op{Op::kReduce, comm, sendbuff, recvbuff, count, datatype, op, root, stream},
                 kSendBuffer | (is_root(comm, root) ? kRecvBuffer : 0u), true, true);
}

SHIM_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  return enqueue("ncclReduceScatter", Op{Op::kReduceScatter, comm, sendbuff, recvbuff, recvcount, datatype, op, 0, stream},
                 kSendBuffer | kRecvBuffer, true, false);
}

SHIM_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                       ncclComm_t comm, cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclAllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream);
  return enqueue("ncclAllGather", Op{Op::kAllGather, comm, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, stream},
                 kSendBuffer | kRecvBuffer, false, false);
}

SHIM_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclBroadcast, sendbuff, recvbuff, count, datatype, root, comm, stream);
  return enqueue("ncclBroadcast", Op{Op::kBroadcast, comm, sendbuff, recvbuff, count, datatype, ncclSum, root, stream},
                 (is_root(comm, root) ? kSendBuffer : 0u) | kRecvBuffer, false, true);
}

SHIM_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclBcast, buff, count, datatype, root, comm, stream);
  return enqueue("ncclBcast", Op{Op::kBroadcast, comm, buff, buff, count, datatype, ncclSum, root, stream},
                 kRecvBuffer, false, true);
}

SHIM_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclComm_t comm, cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclAlltoAll, sendbuff, recvbuff, count, datatype, comm, stream);
  return enqueue("ncclAlltoAll", Op{Op::kAllToAll, comm, sendbuff, recvbuff, count, datatype, ncclSum, 0, stream},
                 kSendBuffer | kRecvBuffer, false, false);
}

SHIM_EXPORT ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm, cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclGather, sendbuff, recvbuff, count, datatype, root, comm, stream);
  return enqueue("ncclGather", Op{Op::kGather, comm, sendbuff, recvbuff, count, datatype, ncclSum, root, stream},
                 kSendBuffer | (is_root(comm, root) ? kRecvBuffer : 0u), false, true);
}

SHIM_EXPORT ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                     int root, ncclComm_t comm, cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclScatter, sendbuff, recvbuff, count, datatype, root, comm, stream);
  return enqueue("ncclScatter", Op{Op::kScatter, comm, sendbuff, recvbuff, count, datatype, ncclSum, root, stream},
                 (is_root(comm, root) ? kSendBuffer : 0u) | kRecvBuffer, false, true);
}

SHIM_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclSend, sendbuff, count, datatype, peer, comm, stream);
  return enqueue("ncclSend", Op{Op::kSend, comm, sendbuff, nullptr, count, datatype, ncclSum, peer, stream},
                 kSendBuffer, false, true);
}

SHIM_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                  cudaStream_t stream) {
  SHIM_FORWARD_FOREIGN(comm, ncclRecv, recvbuff, count, datatype, peer, comm, stream);
  return enqueue("ncclRecv", Op{Op::kRecv, comm, nullptr, recvbuff, count, datatype, ncclSum, peer, stream},
                 kRecvBuffer, false, true);
}

// Operators made here live in the real NCCL (braid has no PreMulSum): calls that use them take NCCL's path.
SHIM_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                  ncclScalarResidence_t residence, ncclComm_t comm) {
  SHIM_FORWARD_FOREIGN(comm, ncclRedOpCreatePreMulSum, op, scalar, datatype, residence, comm);
  return guarded("ncclRedOpCreatePreMulSum", [&] {
    const ncclComm& shim = checked_comm(comm, "ncclRedOpCreatePreMulSum");
    require_pointer(op, "ncclRedOpCreatePreMulSum", "op");
    const auto& api = require_real(shim, "ncclRedOpCreatePreMulSum").api();
    if (api.red_op_create_pre_mul_sum == nullptr) {
      braid::raise(braid::ErrorCode::kUnsupported, "the real NCCL has no ncclRedOpCreatePreMulSum");
    }
    check_real(shim, api.red_op_create_pre_mul_sum(op, scalar, datatype, residence, shim.real),
               "ncclRedOpCreatePreMulSum");
  });
}

SHIM_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  SHIM_FORWARD_FOREIGN(comm, ncclRedOpDestroy, op, comm);
  return guarded("ncclRedOpDestroy", [&] {
    const ncclComm& shim = checked_comm(comm, "ncclRedOpDestroy");
    if (op < ncclNumOps || op >= ncclMaxRedOp) {
      raise_invalid_argument("ncclRedOpDestroy", "op", "is {}, not an operator made by ncclRedOpCreatePreMulSum",
                             static_cast<int>(op));
    }
    const auto& api = require_real(shim, "ncclRedOpDestroy").api();
    if (api.red_op_destroy == nullptr) braid::raise(braid::ErrorCode::kUnsupported, "the real NCCL has no ncclRedOpDestroy");
    check_real(shim, api.red_op_destroy(op, shim.real), "ncclRedOpDestroy");
  });
}

}  // extern "C"

SHIM_ALIAS(ncclAllReduce)
SHIM_ALIAS(ncclReduce)
SHIM_ALIAS(ncclReduceScatter)
SHIM_ALIAS(ncclAllGather)
SHIM_ALIAS(ncclBroadcast)
SHIM_ALIAS(ncclBcast)
SHIM_ALIAS(ncclAlltoAll)
SHIM_ALIAS(ncclGather)
SHIM_ALIAS(ncclScatter)
SHIM_ALIAS(ncclSend)
SHIM_ALIAS(ncclRecv)
SHIM_ALIAS(ncclRedOpCreatePreMulSum)
SHIM_ALIAS(ncclRedOpDestroy)

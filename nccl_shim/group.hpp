// NCCL's groups, on braid and on the real NCCL at once. Between ncclGroupStart and ncclGroupEnd every call is kept
// (after its arguments are checked); ncclGroupEnd runs them: communicator inits in parallel (one thread each, since
// each is collective), collectives in call order, and per communicator every send and receive of the group as one
// braid batch (Communicator::send_recv, in which no pair can deadlock). What falls back to NCCL goes into one
// group of the real NCCL, so its sends and receives pair up across communicators too. Outside a group a call is
// a group of one.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>

namespace braid::shim {

// One NCCL call on a communicator, as kept until its group ends.
struct Op {
  enum Kind { kAllReduce, kReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll, kSend, kRecv, kGather, kScatter };
  Kind kind;
  ncclComm_t comm;
  const void* send;  // kSend: the data; kRecv: unused
  void* recv;        // kRecv: the destination; kSend: unused
  size_t count;      // NCCL's count argument of the call
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;          // root, or the peer of kSend/kRecv
  cudaStream_t stream;
};
const char* op_name(Op::Kind kind);  // "all_reduce", ...

// Runs op now, or keeps it for the end of this thread's group.
ncclResult_t submit(const Op& op);

// A communicator init: kept for the end of this thread's group, or run now: on the communicator's background thread
// where `nonblocking` (ncclInProgress), else before returning. The communicator's `ready` is false until it is done.
ncclResult_t submit_init(ncclComm_t comm, std::function<void()> init, bool nonblocking = false);

// NOTE [group failure]: a call that fails inside a group (its arguments, as NCCL's ncclGroupErrCheck) returns its
// error and fails the group: the ncclGroupEnd that closes it runs nothing the group kept and returns the first
// such error; the communicators it was to initialise report that error (ncclCommGetAsyncError) and stay unusable.
// Records `result` as this thread's group's error where it is a failure inside a group; returns it.
ncclResult_t group_failure(ncclResult_t result);

ncclResult_t group_start();
// Closes one level of this thread's group; the outermost runs what the group kept: its inits, then its calls, or,
// with `simulation` (ncclGroupSimulateEnd; its magic checked as NCCL does), its inits alone, the calls dropped.
ncclResult_t group_end(ncclSimInfo_t* simulation = nullptr);

}  // namespace braid::shim

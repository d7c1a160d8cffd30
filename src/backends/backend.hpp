// What runs a communicator's calls, chosen once at init (comm/communicator.cpp):
//   - CudaBackend (backends/cuda): symmetric memory between the GPUs of one host, braid's own kernels;
//   - NcclCollectives (backends/nccl): an NCCL communicator, for any topology.
// The communicator checks every call's arguments (collectives/call_checks.hpp) and holds its ordering scope
// (sync/call_order.hpp) before it hands the call here, with the communicator's GPU current; a backend neither
// checks arguments again nor orders calls.
#pragma once

#include "collectives/call_checks.hpp"

namespace braid::detail {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;  // "cuda" or "nccl"

  // A checked call with something to move (validate returned true): all-reduce, reduce, reduce-scatter,
  // all-gather, broadcast or all-to-all, enqueued on `stream`.
  virtual void collective(const collectives::CollectiveCall& call, Stream stream) = 0;
  // A checked all-to-all-v with host counts.
  virtual void all_to_allv(const collectives::AllToAllvCall& call, Stream stream) = 0;
  // A checked point-to-point batch with at least one op, in the batch's order.
  virtual void send_recv(const collectives::PointToPointBatch& batch, Stream stream) = 0;

  // Raises a fatal failure an earlier call recorded (a kernel's timeout or mismatch, NCCL's asynchronous error),
  // before anything of the next call is enqueued.
  virtual void raise_recorded_failure() = 0;
  // Communicator::check: raise_recorded_failure, and anything else the backend found wrong since (data a peer
  // refused).
  virtual void check() = 0;
  // Communicator::abort, from any thread, while other threads may be inside calls: this rank's waits end, and
  // raise_recorded_failure raises kAborted from then on (unless another failure was recorded first). Local: the
  // peers are not told. Idempotent; never throws.
  virtual void abort() noexcept = 0;
  // Communicator::revoke: every rank's waits end, and raise_recorded_failure raises kRevoked from then on, on
  // every rank (unless another failure was recorded there first). kUnsupported where the backend cannot tell
  // the peers.
  virtual void revoke() = 0;
};

}  // namespace braid::detail

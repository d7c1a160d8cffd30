// A stand-in for NCCL's library that the NCCL backend's tests load by path (NcclLibrary::load), to see what the
// backend asks of NCCL and when, with no peer and no GPU work: NCCL 2.28.9's exports that the backend requires,
// each of which counts itself on its communicator and returns at once, and test controls (extern "C",
// fake_nccl_*) that hold the calls inside the library and read what each communicator saw. Every communicator
// is rank 0 of its own: its state is its own, so tests on several threads do not meet.
//
// Calls inside the library are the ones between their entry and their return. A call held by fake_nccl_hold waits
// until released or until the communicator is aborted, as a real NCCL call blocked on a peer ends on NCCL's
// abort flag; it then returns ncclSystemError. ncclCommAbort counts whether calls were inside the library when it
// came (what NCCL's thread-safety forbids), marks the communicator aborted, and, unlike NCCL, keeps it readable, so
// a test can read its counts after the abort (aborted communicators live until the process ends).
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#define FAKE_NCCL_EXPORT extern "C" __attribute__((visibility("default")))

struct ncclComm {
  std::mutex mutex;
  std::condition_variable changed;
  bool hold = false;
  bool aborted = false;
  int inside = 0;              // calls inside the library now
  int entered = 0;             // calls that entered, ever
  int calls_after_abort = 0;   // calls that entered after ncclCommAbort
  int aborts_during_calls = 0; // ncclCommAbort with calls inside the library
};

namespace {

// One call on comm, from its entry to its return.
class Call {
 public:
  explicit Call(ncclComm_t comm) : comm_(comm) {
    std::unique_lock<std::mutex> lock(comm_->mutex);
    if (comm_->aborted) ++comm_->calls_after_abort;
    ++comm_->inside;
    ++comm_->entered;
    comm_->changed.notify_all();
    if (comm_->hold) {
      comm_->changed.wait(lock, [&] { return !comm_->hold || comm_->aborted; });
      if (comm_->aborted) result_ = ncclSystemError;
    }
  }
  ~Call() {
    std::lock_guard<std::mutex> lock(comm_->mutex);
    --comm_->inside;
    comm_->changed.notify_all();
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  ncclResult_t result() const { return result_; }

 private:
  ncclComm_t comm_;
  ncclResult_t result_ = ncclSuccess;
};

ncclResult_t call(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  const Call entered(comm);
  return entered.result();
}

}  // namespace

FAKE_NCCL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  *version = 22809;
  return ncclSuccess;
}
FAKE_NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0x5a, sizeof(*id));
  return ncclSuccess;
}
FAKE_NCCL_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "fake NCCL error";
}
FAKE_NCCL_EXPORT const char* ncclGetLastError(ncclComm_t) { return "fake NCCL"; }
FAKE_NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int, ncclUniqueId, int) {
  *comm = new ncclComm();
  return ncclSuccess;
}
FAKE_NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
FAKE_NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (comm->inside > 0) ++comm->aborts_during_calls;
  comm->aborted = true;
  comm->changed.notify_all();
  return ncclSuccess;
}
FAKE_NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  *error = ncclSuccess;
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclGroupStart() { return ncclSuccess; }
FAKE_NCCL_EXPORT ncclResult_t ncclGroupEnd() { return ncclSuccess; }
FAKE_NCCL_EXPORT ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t comm,
                                            cudaStream_t) {
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t comm,
                                         cudaStream_t) {
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                                ncclComm_t comm, cudaStream_t) {
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t comm, cudaStream_t) {
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t comm,
                                            cudaStream_t) {
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t) {
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t) {
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buffer, size_t, void** handle) {
  *handle = buffer;
  return call(comm);
}
FAKE_NCCL_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void*) { return call(comm); }

// ---- Test controls ----

// Holds every later call on comm inside the library (hold != 0) until released (hold == 0) or aborted.
FAKE_NCCL_EXPORT void fake_nccl_hold(ncclComm_t comm, int hold) {
  std::lock_guard<std::mutex> lock(comm->mutex);
  comm->hold = hold != 0;
  comm->changed.notify_all();
}

// Waits up to timeout_ms until `count` calls on comm have entered, ever; whether they had.
FAKE_NCCL_EXPORT int fake_nccl_wait_entered(ncclComm_t comm, int count, int timeout_ms) {
  std::unique_lock<std::mutex> lock(comm->mutex);
  return comm->changed.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return comm->entered >= count; });
}

// What comm saw: calls entered, calls entered after the abort, aborts with calls inside, whether it is aborted.
struct FakeNcclCounts {
  int entered, calls_after_abort, aborts_during_calls, aborted;
};
FAKE_NCCL_EXPORT FakeNcclCounts fake_nccl_counts(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(comm->mutex);
  return {comm->entered, comm->calls_after_abort, comm->aborts_during_calls, comm->aborted ? 1 : 0};
}

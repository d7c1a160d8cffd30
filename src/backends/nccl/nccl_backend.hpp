// One rank's NCCL communicator, the building block of braid's NCCL backend (any topology: ranks on several hosts,
// GPU pairs without P2P). Collectives are stream-ordered calls into NCCL with braid's arguments, already validated
// by the caller; user buffers the caller has registered with braid are registered with NCCL lazily, on the first
// collective that uses them (BRAID_NCCL_REGISTER).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "backends/nccl/nccl_library.hpp"
#include "backends/nccl/nccl_watchdog.hpp"
#include "braid/error.hpp"
#include "braid/types.hpp"

namespace braid {
class Config;
struct PointToPoint;
}

namespace braid::detail {

// BRAID_NCCL_REGISTER: whether user buffers are registered with NCCL (ncclCommRegister, zero copy).
//   kTry: where the library can (NCCL 2.19+); a failure is logged once and the range left unregistered.
//   kYes: always; a library without registration, or a failed registration, is an error (kUnsupported).
//   kNo:  never.
enum class NcclRegisterMode { kTry, kYes, kNo };

// BRAID_NCCL_REGISTER=try|yes|no (default try) from config; a value outside the choices throws kInvalidArgument
// naming the variable.
NcclRegisterMode nccl_register_mode(const Config& config);
NcclRegisterMode nccl_register_mode();  // from the process environment (Config::get())
const char* nccl_register_mode_name(NcclRegisterMode mode);  // "try", "yes", "no"

class NcclBackend {
 public:
  // ncclGetUniqueId's 128 bytes. One rank makes it; the caller hands it to every rank (e.g. host_allgather).
  static std::string make_unique_id(NcclLibrary& library);

  // Collective over the `size` ranks: ncclCommInitRank with `device` current (the caller's current device is
  // restored). unique_id: make_unique_id's bytes (kInvalidArgument if it has another length). Every operation is
  // bounded by timeout_s (NcclWatchdog): one that runs longer aborts the NCCL communicator (infinity: unbounded).
  NcclBackend(std::shared_ptr<NcclLibrary> library, int rank, int size, int device, const std::string& unique_id,
              NcclRegisterMode register_mode, double timeout_s);
  // Deregisters every range still registered, then ncclCommDestroy; ncclCommAbort instead where an asynchronous
  // error was seen or the stack is unwinding (peers may never join a teardown); nothing more after the watchdog
  // aborted the communicator. Never throws.
  ~NcclBackend();
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  NcclRegisterMode register_mode() const { return register_mode_; }
  const NcclLibrary& library() const { return *library_; }
  ncclComm_t comm() const { return comm_; }

  // Collectives with NCCL's arguments, enqueued on stream. Arguments are validated by the caller; the caller has
  // made device() current. A failed call throws braid::Error (mapped from ncclResult_t, naming the call and rank).
  void all_reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, Stream stream);
  void reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root, Stream stream);
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op, Stream stream);
  void all_gather(const void* send, void* recv, size_t send_count, DataType type, Stream stream);
  void broadcast(const void* send, void* recv, size_t count, DataType type, int root, Stream stream);
  // `count` elements to and from every rank: ncclAlltoAll where exported, else one ncclSend and one ncclRecv per
  // peer in a group (kUnsupported where the library has neither). In place (send == recv) NCCL reads a copy of
  // the input made on `stream` (NOTE [in-place all-to-all on NCCL]).
  void all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream);
  // MPI_Alltoallv's shape: host arrays of size() entries, counts and displacements in elements; null
  // displacements mean packed in rank order. One ncclSend and one ncclRecv per peer with a nonzero count (this
  // rank included), in one group. kUnsupported where the library has no ncclSend/ncclRecv.
  void all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                   const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream);
  // A point-to-point batch (Communicator::send_recv): each op an ncclSend or ncclRecv, all in one group, in the
  // batch's order (NCCL matches the k-th send to a peer with the peer's k-th receive, as braid does). kUnsupported
  // where the library has no ncclSend/ncclRecv.
  void send_recv(const PointToPoint* ops, size_t count, Stream stream);

  // Lazy registration of a user buffer's range [base, base + bytes), identified by key (the communicator's id for
  // a registered range). The communicator calls it before a collective for every registered range the call's
  // buffers fall in. The first call for a key registers (per register_mode()); later calls hit a cache and make
  // no NCCL call (base and bytes are then not looked at). Returns whether the range is registered with NCCL.
  // kYes: throws kUnsupported where the library cannot register or ncclCommRegister fails (the key is not
  // remembered, so a later call tries again). Thread-safe; no lock is held across an NCCL call.
  bool ensure_registered(uint64_t key, void* base, size_t bytes);
  // Drops key: ncclCommDeregister if it was registered (a failure is logged, never thrown). Unknown keys: no-op.
  void forget_registered(uint64_t key);
  size_t registered_count() const;  // keys registered with NCCL now
  // ncclCommRegister / ncclCommDeregister calls made so far (tests: a cache hit makes none).
  size_t register_calls() const { return register_calls_.load(); }
  size_t deregister_calls() const { return deregister_calls_.load(); }

  // Throws kTimeout once the watchdog expired (an operation outlived timeout_s; the communicator is aborted), else
  // ncclCommGetAsyncError's failure mapped to braid::Error (a peer gone, a network error); nothing while the
  // communicator is fine or still working.
  void check();
  // ncclCommAbort (once, with the watchdog's) after the NCCL calls other threads are making have returned, waiting
  // at most kAbortWaitForCallsS for them (NOTE [NCCL calls and abort]). From its start, every call of this backend
  // that would enter NCCL raises kAborted instead (kTimeout where the watchdog expired), check() included. Never
  // throws. Safe from any thread, while other threads call the backend.
  void abort() noexcept;
  static constexpr double kAbortWaitForCallsS = 2.0;

 private:
  struct Registration {
    enum class State { kPending, kRegistered, kUnregistered };
    State state = State::kPending;
    void* handle = nullptr;  // ncclCommRegister's, while kRegistered
  };

  // NOTE [NCCL calls and abort]
  // NCCL's calls on one communicator are not thread-safe, and ncclCommAbort frees the communicator: an abort from
  // another thread (the watchdog's, or a user's Communicator::abort) while a call is inside NCCL would pull the
  // communicator from under it. So every call into NCCL on comm_ holds calls_ shared (enter_call), and an abort
  // first sets aborting_, so that no call enters any more (each raises as check() does), then takes calls_
  // exclusively, which waits for the calls inside NCCL to return. Enqueues return in microseconds; a call that has
  // not returned within kAbortWaitForCallsS is blocked in NCCL's host code (a connection to a peer that left), and
  // the abort then runs under it anyway: NCCL's abort flag is what ends that wait.
  using CallLock = std::shared_lock<std::shared_timed_mutex>;
  // calls_ shared for a call into NCCL on comm_; raises kTimeout (the watchdog expired) or kAborted once an abort began.
  CallLock enter_call();
  [[noreturn]] void raise_aborted() const;  // kTimeout where the watchdog expired, else kAborted
  // An operation enqueued into NCCL: the call's lock (enter_call), then a watchdog scope around it on its stream.
  struct WatchedCall {
    CallLock call;
    NcclWatchdog::Scope scope;
  };

  // Throws result's failure naming call; a failure once an abort began is the abort's (raise_aborted).
  void check_call(ncclResult_t result, const char* call) const;
  void abort_communicator() noexcept;  // ncclCommAbort unless done already (NOTE [NCCL calls and abort])
  void raise_if_expired() const;  // kTimeout with the watchdog's message, once it expired
  WatchedCall watch(const char* operation, Stream stream);
  // The grouped ncclSend/ncclRecv behind all_to_all's fallback and all_to_allv. Counts in elements, offsets in
  // elements; a null displacement array means packed.
  void send_recv_group(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                       const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream);
  void deregister(void* handle, uint64_t key) noexcept;

  std::shared_ptr<NcclLibrary> library_;
  int rank_ = -1;
  int size_ = 0;
  int device_ = -1;
  NcclRegisterMode register_mode_ = NcclRegisterMode::kTry;
  std::string rank_text_;  // as error messages show it
  int uncaught_at_init_ = 0;  // std::uncaught_exceptions() at construction: more at destruction means unwinding
  ncclComm_t comm_ = nullptr;
  // The first asynchronous NCCL error check() met, raised again by every later check(), also after an abort(); with
  // one, the destructor aborts the communicator rather than destroys it.
  std::optional<Error> async_failure_;
  std::mutex async_failure_mutex_;
  std::atomic<bool> aborting_{false};  // an abort began: no call enters NCCL (NOTE [NCCL calls and abort])
  std::atomic<bool> aborted_{false};  // by the watchdog or abort(): comm_ is gone
  std::shared_timed_mutex calls_;  // shared by each call inside NCCL, exclusive for ncclCommAbort
  std::mutex abort_mutex_;  // one ncclCommAbort: the watchdog's or abort()'s
  std::unique_ptr<NcclWatchdog> watchdog_;

  mutable std::mutex mutex_;  // guards registrations_ and warned_
  std::condition_variable settled_;  // a pending registration became registered or unregistered
  std::unordered_map<uint64_t, Registration> registrations_;
  bool warned_ = false;  // kTry: the first failure is a warning, later ones debug lines
  std::atomic<size_t> register_calls_{0};
  std::atomic<size_t> deregister_calls_{0};
};

}  // namespace braid::detail

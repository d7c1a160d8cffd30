// Bounds the waits of the NCCL backend by BRAID_TIMEOUT_S, as braid's own kernels bound theirs. NCCL's kernels
// wait for a peer forever: a rank that left (or skipped a call) hangs every other rank's stream. The watchdog
// records an event on the caller's stream behind each operation the backend enqueues; a thread of its own looks at
// the pending operations every few milliseconds, oldest first, and one whose event has not completed within the
// timeout expires: the backend then aborts the NCCL communicator (ncclCommAbort makes NCCL's kernels return), so
// the caller's synchronisation returns, and every later call on the communicator raises kTimeout naming the
// operation. An operation whose host call itself blocks (a connection to a peer that left) expires the same way:
// its event is only recorded once the call returns.
//
// An operation's clock starts when it is enqueued, or when the watchdog saw the previous watched operation on the
// same stream finish, whichever is later: other work queued on the stream in between counts against the timeout
// (as in PyTorch's NCCL watchdog, whose clock starts at the enqueue), a slow watched predecessor does not. One
// event per operation: a start-and-end pair would cost twice the driver calls for no gain. Watching adds one
// event record to an eager call, a small cost beside the call itself (docs/dev/tuning-notes.md); each operation
// is retired by its own query, which costs no more than retiring a stream's in bulk. BRAID_NCCL_WATCHDOG=off
// turns the watchdog off.
//
// Not watched: operations enqueued while their stream is being captured into a CUDA graph (a captured event
// cannot be polled; graph replays of NCCL operations stay unbounded).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace braid::detail {

class NcclWatchdog {
 public:
  // `on_expiry` runs once, on the watchdog's thread, with the expiry's message. The thread starts with the first
  // watched operation. An infinite timeout_s watches nothing (braid-bench's NCCL rows time NCCL alone).
  NcclWatchdog(int device, double timeout_s, std::string rank_text, std::function<void(const std::string&)> on_expiry);
  ~NcclWatchdog();  // stops the thread; the events of operations still pending are released
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // Brackets one operation: the constructor starts its clock, the destructor records its event (also when the
  // operation threw). The device must be current.
  class Scope {
   public:
    Scope(NcclWatchdog& watchdog, const char* operation, cudaStream_t stream);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    NcclWatchdog* watchdog_ = nullptr;  // null: not watched (capturing)
    cudaStream_t stream_ = nullptr;
    uint64_t id_ = 0;
  };

  bool expired() const { return expired_.load(std::memory_order_acquire); }
  std::string message() const;  // the expiry's message; empty while none

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    uint64_t id = 0;
    const char* operation = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t end = nullptr;  // null until the host call returned
    bool unwatched = false;     // the call returned, but no event could be recorded behind it
    Clock::time_point enqueued{};
  };

  cudaEvent_t take_event();  // under mutex_
  void run();
  void expire(const Pending& pending);

  const int device_;
  const std::chrono::duration<double> timeout_;
  const std::string rank_text_;
  const std::function<void(const std::string&)> on_expiry_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  // When the watchdog saw the last watched operation of each stream finish (streams with operations pending).
  std::unordered_map<cudaStream_t, Clock::time_point> finished_at_;
  uint64_t next_id_ = 0;
  bool stopping_ = false;
  std::string message_;
  std::atomic<bool> expired_{false};
  std::thread thread_;
};

}  // namespace braid::detail

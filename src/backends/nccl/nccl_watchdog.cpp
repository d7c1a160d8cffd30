#include "backends/nccl/nccl_watchdog.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/log.hpp"

namespace braid::detail {
namespace {
// How often the thread looks at the pending operations: an expiry is seen within about two intervals of the
// timeout (the start is noticed up to one late), and eager calls enqueued meanwhile only queue up.
constexpr std::chrono::milliseconds kPollInterval(20);
}  // namespace

NcclWatchdog::NcclWatchdog(int device, double timeout_s, std::string rank_text,
                           std::function<void(const std::string&)> on_expiry)
    : device_(device), timeout_(timeout_s), rank_text_(std::move(rank_text)), on_expiry_(std::move(on_expiry)) {}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (const Pending& pending : pending_) {
    if (pending.end != nullptr) cudaEventDestroy(pending.end);
  }
  for (cudaEvent_t event : free_events_) cudaEventDestroy(event);
}

std::string NcclWatchdog::message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

cudaEvent_t NcclWatchdog::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return event;
}

NcclWatchdog::Scope::Scope(NcclWatchdog& watchdog, const char* operation, cudaStream_t stream) : stream_(stream) {
  if (std::isinf(watchdog.timeout_.count())) return;  // unbounded: nothing to watch
  if (watchdog.expired()) return;  // the communicator is being (or was) aborted: the caller raises
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();  // e.g. a stream of another device: NCCL reports it
    return;
  }
  if (capture != cudaStreamCaptureStatusNone) return;
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(watchdog.mutex_);
  Pending pending;
  pending.id = id_ = watchdog.next_id_++;
  pending.operation = operation;
  pending.stream = stream;
  pending.enqueued = now;
  // Only a thread waiting on an empty queue needs waking; with operations pending it looks on its own.
  const bool was_empty = watchdog.pending_.empty();
  watchdog.pending_.push_back(pending);
  watchdog_ = &watchdog;
  if (!watchdog.thread_.joinable()) watchdog.thread_ = std::thread([&watchdog] { watchdog.run(); });
  if (was_empty) watchdog.wake_.notify_one();
}

NcclWatchdog::Scope::~Scope() {
  if (watchdog_ == nullptr) return;
  std::lock_guard<std::mutex> lock(watchdog_->mutex_);
  // From the newest: this operation's entry is the last one pushed unless another thread enqueued meanwhile, and
  // eager calls leave thousands pending between two polls (a search from the oldest cost that many steps a call).
  for (auto it = watchdog_->pending_.rbegin(); it != watchdog_->pending_.rend(); ++it) {
    Pending& pending = *it;
    if (pending.id != id_) continue;
    cudaEvent_t end = watchdog_->take_event();
    if (end != nullptr && cudaEventRecord(end, stream_) != cudaSuccess) {
      cudaGetLastError();
      watchdog_->free_events_.push_back(end);
      end = nullptr;
    }
    pending.end = end;
    pending.unwatched = end == nullptr;  // no event could be made or recorded: the thread drops it
    return;
  }
}

void NcclWatchdog::run() {
  cudaSetDevice(device_);  // the events' device, for the queries below
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    // Drain what has finished, oldest first, then sleep a poll interval whatever is left: a thread that queried
    // each event as soon as the last one finished would contend with the enqueueing thread for the driver on
    // every eager call.
    while (!pending_.empty()) {
      cudaEvent_t end = pending_.front().end;
      const bool unwatched = pending_.front().unwatched;
      // Queried outside the lock: a query may take a while, and the enqueueing thread must not wait for it.
      lock.unlock();
      const bool finished = unwatched || (end != nullptr && cudaEventQuery(end) != cudaErrorNotReady);
      cudaGetLastError();  // a failed query (a sticky error) counts as done: the next call reports it
      const Clock::time_point now = Clock::now();
      lock.lock();
      const Pending front = pending_.front();  // only this thread removes the front: still the same one
      if (finished) {
        if (front.end != nullptr) free_events_.push_back(front.end);
        pending_.pop_front();
        finished_at_[front.stream] = now;
        if (pending_.empty()) finished_at_.clear();  // every later operation is enqueued after now
        continue;
      }
      Clock::time_point start = front.enqueued;
      const auto previous = finished_at_.find(front.stream);
      if (previous != finished_at_.end() && previous->second > start) start = previous->second;
      if (now - start >= timeout_) {
        lock.unlock();
        expire(front);
        return;  // the communicator is aborted: nothing more to watch
      }
      break;
    }
    wake_.wait_for(lock, kPollInterval, [&] { return stopping_; });
  }
}

void NcclWatchdog::expire(const Pending& pending) {
  const std::string text = fmt::format(
      "{}: {} did not complete within {:.1f} s (BRAID_TIMEOUT_S): a peer may have left or skipped the call. The "
      "NCCL communicator was aborted; destroy this communicator.",
      rank_text_, pending.operation, timeout_.count());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    message_ = text;
  }
  expired_.store(true, std::memory_order_release);  // before the abort: later calls raise instead of entering NCCL
  BRAID_WARN("{}", text);
  on_expiry_(text);
}

}  // namespace braid::detail

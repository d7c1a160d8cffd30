#include "backends/nccl/nccl_watchdog.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/log.hpp"

namespace braid::detail {
namespace {
// How often the thread polls the oldest operation while one is pending: often enough that an expiry is seen within
// a small part of any sensible timeout, rarely enough to cost nothing.
constexpr std::chrono::milliseconds kPollInterval(5);
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
    cudaEventDestroy(pending.start);
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
  std::lock_guard<std::mutex> lock(watchdog.mutex_);
  cudaEvent_t start = watchdog.take_event();
  if (start == nullptr) return;
  if (cudaEventRecord(start, stream) != cudaSuccess) {
    cudaGetLastError();
    watchdog.free_events_.push_back(start);
    return;
  }
  Pending pending;
  pending.id = id_ = watchdog.next_id_++;
  pending.operation = operation;
  pending.start = start;
  watchdog.pending_.push_back(pending);
  watchdog_ = &watchdog;
  if (!watchdog.thread_.joinable()) watchdog.thread_ = std::thread([&watchdog] { watchdog.run(); });
  watchdog.wake_.notify_all();
}

NcclWatchdog::Scope::~Scope() {
  if (watchdog_ == nullptr) return;
  std::lock_guard<std::mutex> lock(watchdog_->mutex_);
  for (Pending& pending : watchdog_->pending_) {
    if (pending.id != id_) continue;
    cudaEvent_t end = watchdog_->take_event();
    if (end != nullptr && cudaEventRecord(end, stream_) != cudaSuccess) {
      cudaGetLastError();
      watchdog_->free_events_.push_back(end);
      end = nullptr;
    }
    // Without an end event (none could be made), the start event stands in for it: the operation is then only
    // watched until it starts.
    pending.end = end != nullptr ? end : pending.start;
    if (end == nullptr) pending.start = nullptr;
    return;
  }
}

void NcclWatchdog::run() {
  cudaSetDevice(device_);  // the events' device, for the queries below
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    Pending& oldest = pending_.front();
    // Queried outside the lock: a query may take a while, and the enqueueing thread must not wait for it.
    cudaEvent_t start = oldest.started ? nullptr : oldest.start;
    cudaEvent_t end = oldest.end;
    lock.unlock();
    const bool started = start == nullptr || cudaEventQuery(start) != cudaErrorNotReady;
    const bool finished = end != nullptr && cudaEventQuery(end) != cudaErrorNotReady;
    cudaGetLastError();  // a failed query (a sticky error) counts as done: the next call reports it
    const auto now = std::chrono::steady_clock::now();
    lock.lock();
    Pending& front = pending_.front();  // only this thread removes entries: still the same one
    if (started && !front.started) {
      front.started = true;
      front.deadline = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_);
    }
    if (finished) {
      if (front.start != nullptr) free_events_.push_back(front.start);
      free_events_.push_back(front.end);
      pending_.pop_front();
      continue;
    }
    if (front.started && now >= front.deadline) {
      const Pending expired = front;
      lock.unlock();
      expire(expired);
      return;  // the communicator is aborted: nothing more to watch
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

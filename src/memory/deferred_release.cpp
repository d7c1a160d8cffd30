#include "memory/deferred_release.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "core/capture_mode.hpp"

namespace braid::detail {
namespace {

// Made on first use and never destroyed: its thread may still be dropping objects while the process exits.
class Releaser {
 public:
  static Releaser& get() {
    static Releaser* releaser = new Releaser();
    return *releaser;
  }

  void add(std::shared_ptr<const void> object) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(std::move(object));
    }
    ready_.notify_one();
  }

 private:
  Releaser() { std::thread([this] { run(); }).detach(); }

  void run() {
    RelaxedCaptureMode relaxed;
    for (;;) {
      std::deque<std::shared_ptr<const void>> batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !pending_.empty(); });
        batch.swap(pending_);
      }
      batch.clear();  // outside the lock: destructors may take a while
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<const void>> pending_;
};

}  // namespace

void release_later(std::shared_ptr<const void> object) {
  if (object) Releaser::get().add(std::move(object));
}

}  // namespace braid::detail

// Rate limit for warnings a peer can provoke at will (a store client sending garbage, a stranger on a socket):
// at most `burst` reports per `window`, and the next report says how many were held back.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace braid {

class RateLimit {
 public:
  using Clock = std::chrono::steady_clock;
  RateLimit(int burst, Clock::duration window) : burst_(burst), window_(window) {}

  // Whether to report this event now. Not thread-safe: one owner (a server thread) or the caller's lock.
  bool allow(Clock::time_point now = Clock::now()) {
    if (now - window_start_ >= window_) {
      window_start_ = now;
      reported_ = 0;
    }
    if (reported_ < burst_) {
      ++reported_;
      return true;
    }
    ++suppressed_;
    return false;
  }

  // What the next report appends: " (N similar warnings held back)" for the events held back since the last
  // report, or nothing; starts counting again.
  std::string held_back_note() {
    const uint64_t count = suppressed_;
    suppressed_ = 0;
    return count == 0 ? std::string() : " (" + std::to_string(count) + " similar warnings held back)";
  }

 private:
  int burst_;
  Clock::duration window_;
  Clock::time_point window_start_{};
  int reported_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace braid

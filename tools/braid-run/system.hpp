// braid-run's small system helpers: the clock, errno as an exception, a file descriptor that closes itself, and
// close-on-exec pipes.
#pragma once

#include <unistd.h>

#include <chrono>
#include <string>
#include <utility>

namespace braid::run {

using Clock = std::chrono::steady_clock;

[[noreturn]] void throw_errno(const std::string& what);

// Owns one file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Pipe whose ends are close-on-exec, so no child inherits another rank's pipes (or its own read end).
void make_pipe(UniqueFd& read_end, UniqueFd& write_end);

}  // namespace braid::run

// braid-run's output: OutputSink's queue and non-blocking writes, the two standard sinks, and LineForwarder's
// cutting of a rank's bytes into prefixed lines.
#include "output.hpp"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

#include <fmt/format.h>

namespace braid::run {

void OutputSink::push(std::string_view text) {
  if (closed_) return;
  if (queued_.size() - sent_ + text.size() > kMaxQueued) {
    dropped_ += text.size();
    return;
  }
  queued_.append(text);
  flush();
}

void OutputSink::flush() {
  write_available();
  if (sent_ == queued_.size() || sent_ > queued_.size() / 2) {
    queued_.erase(0, sent_);
    sent_ = 0;
  }
}

void OutputSink::drain(double seconds) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (pending() && !closed_ && Clock::now() < deadline) {
    pollfd writable{fd_, POLLOUT, 0};
    ::poll(&writable, 1, 20);
    flush();
  }
  const size_t lost = dropped_ + (queued_.size() - sent_);
  queued_.clear();
  sent_ = dropped_ = 0;
  if (lost != 0 && !closed_) {
    push(fmt::format("braid-run: {} bytes of output were dropped: this stream was not read\n", lost));
    flush();
  }
}

void OutputSink::write_available() {
  while (pending() && !closed_) {
    pollfd writable{fd_, POLLOUT, 0};
    if (::poll(&writable, 1, 0) < 0) return;
    if ((writable.revents & (POLLERR | POLLNVAL)) != 0) return close();
    if ((writable.revents & POLLOUT) == 0) return;
    const size_t piece = std::min(queued_.size() - sent_, size_t(PIPE_BUF));
    const ssize_t n = ::write(fd_, queued_.data() + sent_, piece);
    if (n > 0) {
      sent_ += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else if (!(n < 0 && errno == EINTR)) {
      return close();  // EPIPE and the like: the reader went away; the output goes with it
    }
  }
}

void OutputSink::close() {
  closed_ = true;
  queued_.clear();
  sent_ = 0;
}

OutputSink& standard_output() {
  static OutputSink sink(STDOUT_FILENO);
  return sink;
}

OutputSink& standard_error() {
  static OutputSink sink(STDERR_FILENO);
  return sink;
}

void say(const std::string& message) { standard_error().push("braid-run: " + message + "\n"); }

LineForwarder::LineForwarder(UniqueFd pipe, OutputSink& target, std::string prefix)
    : pipe_(std::move(pipe)), target_(&target), prefix_(std::move(prefix)) {
  ::fcntl(pipe_.get(), F_SETFL, ::fcntl(pipe_.get(), F_GETFL) | O_NONBLOCK);
}

void LineForwarder::read_available(bool until_empty) {
  char buffer[64 * 1024];
  while (open()) {
    ssize_t n = ::read(pipe_.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) close_and_flush();
      return;
    }
    pending_.append(buffer, static_cast<size_t>(n));
    forward_lines();
    if (!until_empty) return;
  }
}

void LineForwarder::close_and_flush() {
  if (!pending_.empty()) {
    pending_ += '\n';
    forward_lines();
  }
  pipe_.reset();
}

void LineForwarder::forward_lines() {
  size_t end = pending_.rfind('\n');
  if (end == std::string::npos) {
    if (pending_.size() < kMaxLine) return;
    pending_ += '\n';
    end = pending_.size() - 1;
  }
  std::string out;
  out.reserve(end + 1 + prefix_.size() * 16);
  for (size_t start = 0; start <= end;) {
    size_t newline = pending_.find('\n', start);
    out += prefix_;
    out.append(pending_, start, newline + 1 - start);
    start = newline + 1;
  }
  pending_.erase(0, end + 1);
  target_->push(out);
}

}  // namespace braid::run

// braid-run's output: its own stdout and stderr, which it never blocks on (OutputSink), its own messages (say),
// and each rank's pipes forwarded there line by line (LineForwarder).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "system.hpp"

namespace braid::run {

// braid-run's own stdout or stderr, which it never blocks on: a reader that stops reading (a stuck pager, a
// pipe nobody drains) must not keep braid-run from handling signals and its ranks. Output waits in a queue
// and goes out in pieces the fd takes at once (at most PIPE_BUF bytes once poll says it is writable: a pipe
// then has a free page); beyond kMaxQueued it is dropped, and braid-run says how much at the end, where it can.
class OutputSink {
 public:
  static constexpr size_t kMaxQueued = size_t(16) << 20;

  explicit OutputSink(int fd) : fd_(fd) {}
  int fd() const { return fd_; }
  bool pending() const { return sent_ < queued_.size(); }

  // Queues whole lines (or drops them when the queue is full) and writes what the fd takes now.
  void push(std::string_view text);

  // Writes what the fd takes without blocking, then drops what was written once it is most of the queue (each
  // byte moves O(1) times).
  void flush();

  // At exit: writes what the fd takes within `seconds`, then tells (where it can) what was dropped.
  void drain(double seconds);

 private:
  void write_available();

  void close();

  int fd_;
  std::string queued_;
  size_t sent_ = 0;     // prefix of queued_ already written
  size_t dropped_ = 0;  // bytes that found the queue full
  bool closed_ = false;
};

OutputSink& standard_output();

OutputSink& standard_error();

// A message from braid-run itself, on stderr, as one piece so it does not split a rank's line.
void say(const std::string& message);

// Output. One LineForwarder per rank and stream reads the rank's pipe and writes whole lines, prefixed,
// to braid-run's own stdout or stderr. Only braid-run writes there, one write() per batch of whole
// lines, so lines of different ranks never interleave mid-line.

class LineForwarder {
 public:
  // A line longer than this without a newline is cut, so one rank cannot make braid-run buffer without bound.
  static constexpr size_t kMaxLine = 64 * 1024;

  LineForwarder(UniqueFd pipe, OutputSink& target, std::string prefix);

  int fd() const { return pipe_.get(); }
  bool open() const { return static_cast<bool>(pipe_); }

  // Reads once (or, with until_empty, until the pipe has nothing more now) and forwards whole lines.
  // At end of file, forwards a partial last line and closes the pipe.
  void read_available(bool until_empty);

  void close_and_flush();

 private:
  void forward_lines();

  UniqueFd pipe_;
  OutputSink* target_;
  std::string prefix_;
  std::string pending_;  // bytes after the last newline seen
};

}  // namespace braid::run

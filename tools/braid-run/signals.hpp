// Signals. Handlers only set a flag and write a byte to a self-pipe that the poll loop watches, so a
// signal arriving at any moment (even just before poll()) wakes the loop; all real work happens there.
#pragma once

#include <signal.h>

#include "system.hpp"

namespace braid::run {

// Forwarded to every rank, and the job stops (braid-run exits with 128 + the signal).
constexpr int kStoppingSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
// Forwarded to every rank only: the ranks decide what they mean.
constexpr int kPassedSignals[] = {SIGUSR1, SIGUSR2};

class SignalPipe {
 public:
  SignalPipe();

  ~SignalPipe();

  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_end_.get(); }

  void drain();

  // Whether `signo` arrived since the last call.
  bool take(int signo);

  // In a forked child before exec: the dispositions braid-run started with (async-signal-safe).
  void restore_in_child() const;

 private:
  void install(int signo);

  UniqueFd read_end_, write_end_;
  struct sigaction saved_[NSIG] {};
};

}  // namespace braid::run

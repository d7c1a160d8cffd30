// braid-run's signal handler and its self-pipe: which signals it catches, how each is installed, and how the
// dispositions it started with come back (at its end, and in each rank before exec).
#include "signals.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace braid::run {
namespace {

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD, SIGPIPE};

volatile sig_atomic_t g_pending[NSIG];
int g_wake_fd = -1;

extern "C" void on_signal(int signo) {
  int saved_errno = errno;
  g_pending[signo] = 1;
  char byte = 0;
  [[maybe_unused]] ssize_t ignored = ::write(g_wake_fd, &byte, 1);  // full pipe: a wake-up is pending
  errno = saved_errno;
}

}  // namespace

SignalPipe::SignalPipe() {
  make_pipe(read_end_, write_end_);
  for (const UniqueFd* end : {&read_end_, &write_end_}) {
    ::fcntl(end->get(), F_SETFL, ::fcntl(end->get(), F_GETFL) | O_NONBLOCK);
  }
  g_wake_fd = write_end_.get();
  for (int signo : kHandledSignals) install(signo);
}

SignalPipe::~SignalPipe() {
  for (int signo : kHandledSignals) ::sigaction(signo, &saved_[signo], nullptr);
  g_wake_fd = -1;
}

void SignalPipe::drain() {
  char buffer[256];
  while (::read(read_end_.get(), buffer, sizeof buffer) > 0) {
  }
}

bool SignalPipe::take(int signo) {
  if (!g_pending[signo]) return false;
  g_pending[signo] = 0;
  return true;
}

void SignalPipe::restore_in_child() const {
  for (int signo : kHandledSignals) ::sigaction(signo, &saved_[signo], nullptr);
}

void SignalPipe::install(int signo) {
  ::sigaction(signo, nullptr, &saved_[signo]);
  // A forwarded signal ignored when braid-run started (nohup, a background job) stays ignored, as in
  // a shell. SIGCHLD is always caught: ignoring it would make the kernel reap the ranks for us.
  bool forwarded = signo != SIGCHLD && signo != SIGPIPE;
  if (forwarded && saved_[signo].sa_handler == SIG_IGN) return;
  struct sigaction action {};
  // SIGPIPE: a reader of braid-run's output going away must not kill it while ranks run.
  action.sa_handler = signo == SIGPIPE ? SIG_IGN : on_signal;
  ::sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | (signo == SIGCHLD ? SA_NOCLDSTOP : 0);
  ::sigaction(signo, &action, nullptr);
}

}  // namespace braid::run

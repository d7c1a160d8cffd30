// The guardian (NOTE [guardian]): the process braid-run forks first, and the socket pair over which it learns
// which process groups to SIGKILL once braid-run is gone.
#include "guardian.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <iterator>
#include <utility>

#include "launcher.hpp"

namespace braid::run {
namespace {

// The guardian's end of the socket pair, after it has rearranged its descriptors.
constexpr int kGuardianChannelFd = 3;

// Closes every descriptor from `first` on (up to `last` where close_range is missing).
void close_descriptors_from(int first, int last) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), ~0U, 0U) == 0) return;
#endif
  for (int fd = first; fd <= last; ++fd) ::close(fd);
}

[[noreturn]] void run_guardian(int launcher_end, int guardian_end, int last_fd) {
  ::setpgid(0, 0);
  ::close(launcher_end);
  if (guardian_end != kGuardianChannelFd) ::dup2(guardian_end, kGuardianChannelFd);
  close_descriptors_from(kGuardianChannelFd + 1, last_fd);
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) ::dup2(null_fd, fd);
    if (null_fd > STDERR_FILENO) ::close(null_fd);
  }
  [[maybe_unused]] int ignored = ::chdir("/");
  pid_t groups[kMaxRanks] = {};
  for (;;) {
    int32_t message = 0;
    const ssize_t n = ::recv(kGuardianChannelFd, &message, sizeof message, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of file: braid-run is gone
    if (n != sizeof message || message == 0 || message == INT32_MIN) continue;
    pid_t* slot = std::find(std::begin(groups), std::end(groups), message > 0 ? 0 : -message);
    if (slot != std::end(groups)) *slot = message > 0 ? message : 0;
  }
  for (pid_t group : groups) {
    if (group > 0) ::kill(-group, SIGKILL);
  }
  ::_exit(0);
}

}  // namespace

void send_group_message(int channel, int32_t message) {
  while (::send(channel, &message, sizeof message, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

Guardian::Guardian() {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) throw_errno("socketpair");
  UniqueFd launcher_end(ends[0]), guardian_end(ends[1]);
  rlimit files{};
  const int last_fd = ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < (1u << 20)
                          ? static_cast<int>(files.rlim_cur) - 1
                          : (1 << 20) - 1;
  // Every signal stays blocked in the guardian; in braid-run the mask is restored after fork.
  sigset_t all, original;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &original);
  pid_ = ::fork();
  if (pid_ == 0) run_guardian(launcher_end.get(), guardian_end.get(), last_fd);
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &original, nullptr);
  if (pid_ < 0) {
    errno = fork_errno;
    throw_errno("fork for the guardian");
  }
  channel_ = std::move(launcher_end);
}

Guardian::~Guardian() {
  channel_.reset();
  if (gone_) return;
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (::waitpid(pid_, nullptr, WNOHANG) == 0 && Clock::now() < deadline) {
    ::usleep(1000);
  }
}

}  // namespace braid::run

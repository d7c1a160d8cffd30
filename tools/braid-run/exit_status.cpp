// How a rank ended, as braid-run reports it: signal names, exit codes and wait statuses.
#include "exit_status.hpp"

#include <string.h>
#include <sys/wait.h>

#include <fmt/format.h>

namespace braid::run {

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", signo);
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

std::string describe_exit(int status) {
  return WIFSIGNALED(status) ? fmt::format("was killed by signal {}", signal_name(WTERMSIG(status)))
                             : fmt::format("exited with code {}", WEXITSTATUS(status));
}

int wait_status_of(const siginfo_t& info) {
  if (info.si_code == CLD_EXITED) return (info.si_status & 0xff) << 8;
  return (info.si_status & 0x7f) | (info.si_code == CLD_DUMPED ? 0x80 : 0);
}

}  // namespace braid::run

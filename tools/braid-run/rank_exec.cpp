// What each rank runs: braid-run's environment with the rank's rendezvous variables, the exec plan, and the
// forked child's last steps (its group, the guardian, stdio, signals) before exec.
#include "rank_exec.hpp"

#include <poll.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "guardian.hpp"

extern char** environ;

namespace braid::run {
namespace {

// Writes all of `text` (async-signal-safe: a forked rank's last words before exec, into the pipe braid-run
// reads). An error such as EPIPE drops the output. braid-run's own output goes through OutputSink instead.
void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n > 0) {
      text.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EAGAIN) {
      pollfd writable{fd, POLLOUT, 0};
      ::poll(&writable, 1, -1);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;
    }
  }
}

// The process environment with this rank's rendezvous variables set (replacing any inherited ones).
std::vector<std::string> rank_environment(int rank, const JobInfo& job) {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"BRAID_RANK", std::to_string(rank)},
      {"BRAID_WORLD_SIZE", std::to_string(job.size)},
      {"BRAID_LOCAL_RANK", std::to_string(rank)},  // one host: local rank = rank, which selects the GPU
      {"BRAID_LOCAL_SIZE", std::to_string(job.size)},
      {"BRAID_STORE_ADDR", job.store_address},
      {"BRAID_JOB_ID", job.job_id},
      {"BRAID_JOB_SECRET", job.job_secret},
  };
  std::vector<std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view text(*entry);
    bool replaced = std::any_of(ours.begin(), ours.end(), [&](const auto& var) {
      return text.size() > var.first.size() && text.starts_with(var.first) && text[var.first.size()] == '=';
    });
    if (!replaced) env.emplace_back(text);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  return env;
}

}  // namespace

ExecPlan make_exec_plan(int rank, const JobInfo& job, const std::vector<std::string>& command) {
  ExecPlan plan;
  plan.argv_storage = command;
  plan.env_storage = rank_environment(rank, job);
  plan.argv = ExecPlan::pointers(plan.argv_storage);
  plan.envp = ExecPlan::pointers(plan.env_storage);
  plan.cannot_run = fmt::format("braid-run: cannot run '{}': ", command[0]);
  return plan;
}

[[noreturn]] void exec_child(const ExecPlan& plan, int stdin_fd, int stdout_fd, int stderr_fd,
                             const SignalPipe& signals, const sigset_t& original_mask, pid_t launcher,
                             int guardian_channel) {
  ::setpgid(0, 0);
  // Killed when braid-run dies, however it dies; if it died before this line, the rank never starts.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(128 + SIGKILL);
  // Before exec, so the guardian knows the group before it can have a descendant (NOTE [guardian]).
  send_group_message(guardian_channel, ::getpid());
  signals.restore_in_child();
  ::sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  ::dup2(stdin_fd, STDIN_FILENO);  // dup2 clears close-on-exec on the new descriptors
  ::dup2(stdout_fd, STDOUT_FILENO);
  ::dup2(stderr_fd, STDERR_FILENO);
  ::execvpe(plan.argv[0], plan.argv.data(), plan.envp.data());
  const char* reason = ::strerrordesc_np(errno);
  write_all(STDERR_FILENO, plan.cannot_run);
  write_all(STDERR_FILENO, reason ? reason : "unknown error");
  write_all(STDERR_FILENO, "\n");
  ::_exit(127);
}

}  // namespace braid::run

// What each rank runs: its argv and environment (the job's rendezvous variables), prepared before fork, and the
// forked child's steps from fork to exec.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "signals.hpp"

namespace braid::run {

// Everything a rank's exec needs, prepared before fork: the child may only make async-signal-safe calls
// (the store's thread may hold locks, e.g. malloc's, at the moment of fork).
struct ExecPlan {
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, envp;
  std::string cannot_run;  // "braid-run: cannot run 'prog': "

  static std::vector<char*> pointers(std::vector<std::string>& strings) {
    std::vector<char*> result;
    for (std::string& s : strings) result.push_back(s.data());
    result.push_back(nullptr);
    return result;
  }
};

struct JobInfo {
  int size;
  std::string store_address;
  std::string job_id;
  std::string job_secret;
};

ExecPlan make_exec_plan(int rank, const JobInfo& job, const std::vector<std::string>& command);

// The forked child: own process group (so a signal to the group reaches the rank's whole process tree),
// the group announced to the guardian, stdio onto the pipes, braid-run's original signal state, then exec.
// Only async-signal-safe calls.
[[noreturn]] void exec_child(const ExecPlan& plan, int stdin_fd, int stdout_fd, int stderr_fd,
                             const SignalPipe& signals, const sigset_t& original_mask, pid_t launcher,
                             int guardian_channel);

}  // namespace braid::run

// The job: starts the ranks, then one poll loop forwards output, reaps ranks and reacts to signals; launch()
// serves the store, runs the job and returns braid-run's exit code.
#include "launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/store.hpp"
#include "exit_status.hpp"
#include "guardian.hpp"
#include "output.hpp"
#include "processes.hpp"
#include "rank_exec.hpp"
#include "signals.hpp"
#include "system.hpp"

namespace braid::run {
namespace {

// ------------------------------------------------------------------------------------------------
// Ranks.

struct Rank {
  Rank(int index, pid_t pid, UniqueFd out, UniqueFd err, bool prefix)
      : index(index),
        pid(pid),
        out(std::move(out), standard_output(), prefix ? fmt::format("[{}] ", index) : ""),
        err(std::move(err), standard_error(), prefix ? fmt::format("[{}] ", index) : "") {}

  int index;
  pid_t pid;              // also the id of its process group
  bool running = true;    // its leader has not exited
  bool released = false;  // its leader is reaped: braid-run never signals the group again
  LineForwarder out, err;
};

// NOTE [group ids]
// A rank's process-group id is its leader's pid, and the kernel gives that number to nobody else while the
// leader is unreaped (or any member lives). So braid-run learns of a leader's exit with WNOWAIT and keeps the
// zombie while the group may still have members: it signals only groups whose leader it has not reaped,
// and it reaps a leader only once /proc shows no live member left in the group (or SIGKILL went out a while
// ago), right after telling the guardian to forget the group. Neither braid-run nor the guardian thus
// signals a recycled id; the one gap is braid-run dying while it holds a zombie whose group is empty, when
// init may reap that zombie just before the guardian's kill.
// Held zombies come first in braid-run's list of children, so waitid(P_ALL) stops at them; orphans behind
// them are found in /proc.

// When SIGKILL has gone out and a group still shows members (stuck in the kernel), braid-run waits this long,
// then reaps the leader and exits anyway: the members die when the kernel lets them.
constexpr double kKillSettleS = 1.0;
// While groups are being stopped, /proc is scanned at most this often.
constexpr auto kScanInterval = std::chrono::milliseconds(100);

// ------------------------------------------------------------------------------------------------
// The job: starts the ranks, then one poll loop forwards output, reaps ranks and reacts to signals.

class Job {
 public:
  Job(const LaunchOptions& options, JobInfo info, Guardian& guardian)
      : options_(options), info_(std::move(info)), guardian_(guardian) {}

  ~Job() {
    // Only reached with groups not yet released when braid-run itself fails: take them down with it.
    for (const Rank& rank : ranks_) {
      if (!rank.released) ::kill(-rank.pid, SIGKILL);
    }
    for (Rank& rank : ranks_) {
      if (!rank.released) release(rank);
    }
  }

  void start() {
    UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!devnull) throw_errno("open /dev/null");
    ranks_.reserve(static_cast<size_t>(options_.nprocs));
    for (int rank = 0; rank < options_.nprocs; ++rank) start_rank(rank, devnull.get());
  }

  int wait() {
    while (!finished()) {
      poll_once(poll_timeout_ms());
      handle_signals();
      collect_exits();
      reap_others();
      release_emptied_groups();
      enforce_grace();
      stop_leftovers();
      enforce_deadline();
    }
    for (Rank& rank : ranks_) {
      rank.out.read_available(true);
      rank.err.read_available(true);
      rank.out.close_and_flush();
      rank.err.close_and_flush();
    }
    return exit_code_.value_or(0);
  }

 private:
  void start_rank(int index, int stdin_fd) {
    ExecPlan plan = make_exec_plan(index, info_, options_.command);
    UniqueFd out_read, out_write, err_read, err_write;
    make_pipe(out_read, out_write);
    make_pipe(err_read, err_write);
    // Block signals across fork so no handler runs in the child before it restores the original state
    // (a handler there would write into braid-run's self-pipe).
    sigset_t all, original;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &original);
    const pid_t launcher = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      exec_child(plan, stdin_fd, out_write.get(), err_write.get(), signals_, original, launcher, guardian_.channel());
    }
    int fork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &original, nullptr);
    if (pid < 0) {
      errno = fork_errno;
      throw_errno(fmt::format("fork for rank {}", index));
    }
    // Also set the group here, so a signal sent right away reaches it even if the child has not run yet.
    ::setpgid(pid, pid);
    ranks_.emplace_back(index, pid, std::move(out_read), std::move(err_read), options_.prefix);
  }

  bool stopping() const { return kill_deadline_.has_value(); }
  bool any_running() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
  }
  // A rank whose leader exited and was not reaped yet: its zombie keeps the group id (NOTE [group ids]).
  static bool held(const Rank& rank) { return !rank.running && !rank.released; }
  bool any_held() const { return std::any_of(ranks_.begin(), ranks_.end(), held); }

  // Done when every leader is reaped, which happens once its group is empty (NOTE [group ids]).
  bool finished() const {
    return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.released; });
  }

  int poll_timeout_ms() const {
    // SIGCHLD and signals wake the loop through the self-pipe.
    if (!stopping() && first_success_) {  // wake at the grace deadline
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(first_success_->deadline - Clock::now());
      return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 1000));
    }
    if (!stopping()) return -1;
    // While stopping, wake at the SIGKILL deadline, and every scan interval to see whether the groups are
    // empty (members that are not our children send no SIGCHLD).
    if (killed_) return any_held() ? static_cast<int>(kScanInterval.count()) : -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline_ - Clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, kScanInterval.count()));
  }

  void poll_once(int timeout_ms) {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    // braid-run's own outputs, while output waits for them (their readers may be slow).
    for (OutputSink* sink : {&standard_output(), &standard_error()}) {
      fds.push_back({sink->pending() ? sink->fd() : -1, POLLOUT, 0});
    }
    constexpr size_t kFirstForwarder = 3;
    std::vector<LineForwarder*> forwarders;
    for (Rank& rank : ranks_) {
      for (LineForwarder* forwarder : {&rank.out, &rank.err}) {
        if (!forwarder->open()) continue;
        fds.push_back({forwarder->fd(), POLLIN, 0});
        forwarders.push_back(forwarder);
      }
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) return;
      throw_errno("poll");
    }
    if (fds[0].revents != 0) signals_.drain();
    if (fds[1].revents != 0) standard_output().flush();
    if (fds[2].revents != 0) standard_error().flush();
    for (size_t i = 0; i < forwarders.size(); ++i) {
      if (fds[i + kFirstForwarder].revents != 0) forwarders[i]->read_available(false);
    }
  }

  void handle_signals() {
    for (int signo : kStoppingSignals) {
      if (!signals_.take(signo)) continue;
      if (!exit_code_) {
        exit_code_ = 128 + signo;
        say(fmt::format("got {}; stopping the ranks", signal_name(signo)));
      }
      begin_stop(signo);  // forwards it as it is (SIGINT stays SIGINT)
    }
    for (int signo : kPassedSignals) {
      if (signals_.take(signo)) signal_all(signo);
    }
  }

  // Learns which leaders exited, leaving them unreaped (NOTE [group ids]).
  void collect_exits() {
    for (Rank& rank : ranks_) {
      if (!rank.running) continue;
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(rank.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == rank.pid) {
        on_rank_exit(rank, wait_status_of(info));
      }
    }
  }

  Rank* unreleased_rank_led_by(pid_t pid) {
    auto rank = std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.pid == pid && !r.released; });
    return rank == ranks_.end() ? nullptr : &*rank;
  }

  // Reaps every exited child but the leaders braid-run holds: orphans from the ranks' trees (braid-run is
  // their subreaper) and the guardian. Runs after SIGCHLD only.
  void reap_others() {
    if (!signals_.take(SIGCHLD)) return;
    for (;;) {
      siginfo_t info{};
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
      Rank* rank = unreleased_rank_led_by(info.si_pid);
      if (rank == nullptr) {
        reap_child(info.si_pid);
        continue;
      }
      if (rank->running) on_rank_exit(*rank, wait_status_of(info));  // it exited after collect_exits
      break;  // a held leader hides the zombies behind it
    }
    auto processes = list_processes();
    if (!processes) return;
    const pid_t self = ::getpid();
    for (const ProcessEntry& process : *processes) {
      if (process.parent == self && process.state == 'Z' && !unreleased_rank_led_by(process.pid)) {
        reap_child(process.pid);
      }
    }
  }

  void reap_child(pid_t pid) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG) != 0 || info.si_pid != pid) return;
    if (pid == guardian_.pid()) {
      guardian_.mark_gone();
      say(fmt::format("the guardian process {} {}; if braid-run is killed now, its ranks outlive it", pid,
                      describe_exit(wait_status_of(info))));
    }
  }

  void on_rank_exit(Rank& rank, int status) {
    rank.running = false;
    leader_exited_ = true;
    // Its last output first, so the failure message follows it.
    rank.out.read_available(true);
    rank.err.read_available(true);
    bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (!failed && !first_success_ && options_.grace_s > 0) {
      first_success_ = FirstSuccess{rank.index, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                                    std::chrono::duration<double>(options_.grace_s))};
    }
    if (!failed || exit_code_) return;  // only the first failure (or signal) decides the exit code
    exit_code_ = exit_code_of(status);
    say(fmt::format("rank {} {}", rank.index, describe_exit(status)));
    begin_stop(SIGTERM);
  }

  // Tells the guardian to forget the group, then reaps its leader (waiting for it only after SIGKILL).
  void release(Rank& rank) {
    guardian_.forget(rank.pid);
    while (::waitpid(rank.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    rank.running = false;
    rank.released = true;
  }

  // Releases held ranks whose group has no live member left. /proc is read when a leader has just exited
  // (once) and, while the job stops or ends, at most every kScanInterval; the job's run costs nothing.
  // Leftover members of a group get the stop's grace (a shell that forwarded SIGTERM and exited while its
  // child still cleans up), then SIGKILL, then kKillSettleS.
  void release_emptied_groups() {
    const bool ending = stopping() || !any_running();
    const bool due = leader_exited_ || (ending && Clock::now() >= next_scan_);
    if (!any_held() || !due) return;
    leader_exited_ = false;
    next_scan_ = Clock::now() + kScanInterval;
    const auto processes = list_processes();  // unreadable: treat every group as occupied
    const bool settled = killed_ && Clock::now() >= *kill_settled_;
    for (Rank& rank : ranks_) {
      if (!held(rank)) continue;
      const bool occupied = !processes || std::any_of(processes->begin(), processes->end(), [&](const ProcessEntry& p) {
        return p.group == rank.pid && p.pid != rank.pid && !is_gone(p);
      });
      if (!occupied || settled) release(rank);
    }
  }

  // Every leader has exited and some groups still have processes (a rank's background child): they are
  // stopped as a failed job's ranks are, without changing the exit code.
  void stop_leftovers() {
    if (stopping() || any_running() || !any_held()) return;
    std::vector<int> left;
    for (const Rank& rank : ranks_) {
      if (held(rank)) left.push_back(rank.index);
    }
    say(fmt::format("rank(s) {} exited and left processes in their process group; stopping them",
                    fmt::join(left, ", ")));
    begin_stop(SIGTERM);
  }

  void begin_stop(int signo) {
    if (!kill_deadline_) {
      kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(options_.timeout_s));
    }
    signal_all(signo);
  }

  // A rank that exited 0 while another hangs must not leave braid-run waiting forever.
  void enforce_grace() {
    if (!first_success_ || stopping() || Clock::now() < first_success_->deadline) return;
    std::vector<int> running;
    for (const Rank& rank : ranks_) {
      if (rank.running) running.push_back(rank.index);
    }
    if (running.empty()) return;
    exit_code_ = kExitGraceExpired;
    say(fmt::format("rank {} exited 0 {} s ago and rank(s) {} still run (--grace-s); stopping them",
                    first_success_->rank, options_.grace_s, fmt::join(running, ", ")));
    begin_stop(SIGTERM);
  }

  void enforce_deadline() {
    if (!stopping() || killed_ || Clock::now() < *kill_deadline_) return;
    say(fmt::format("ranks' processes still running {} s after being stopped; sending SIGKILL", options_.timeout_s));
    signal_all(SIGKILL);
    killed_ = true;
    kill_settled_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(kKillSettleS));
  }

  // Signals every group braid-run has not released, whether its leader still runs or is a held zombie
  // (NOTE [group ids]).
  void signal_all(int signo) {
    for (const Rank& rank : ranks_) {
      if (!rank.released) ::kill(-rank.pid, signo);
    }
  }

  const LaunchOptions& options_;
  JobInfo info_;
  Guardian& guardian_;
  SignalPipe signals_;
  std::vector<Rank> ranks_;
  std::optional<int> exit_code_;                    // set by the first failing rank or received signal
  std::optional<Clock::time_point> kill_deadline_;  // set once the job is being stopped
  bool killed_ = false;                             // SIGKILL has been sent
  std::optional<Clock::time_point> kill_settled_;   // after SIGKILL, when occupied groups are released anyway
  bool leader_exited_ = false;                      // a leader exited since the last scan of /proc
  Clock::time_point next_scan_{};                   // while stopping, the earliest next scan of /proc
  struct FirstSuccess {
    int rank;
    Clock::time_point deadline;  // the others must be done by then (--grace-s)
  };
  std::optional<FirstSuccess> first_success_;       // the first rank that exited 0
};

// What braid-run still has to write when the job is over gets this long; a reader that takes nothing then
// does not hold braid-run (or its exit code) any longer.
constexpr double kFinalOutputS = 2.0;

void drain_outputs() {
  standard_output().drain(kFinalOutputS);
  standard_error().drain(kFinalOutputS);
}

std::string new_job_id() {
  std::random_device random;
  return fmt::format("run-{}-{:08x}", ::getpid(), static_cast<uint32_t>(random()));
}

}  // namespace

int launch(const LaunchOptions& options) {
  try {
    // Orphans of the ranks' process trees become braid-run's children, so it reaps them (no zombies
    // under an init that does not reap) and can tell when a stopped rank's group is really empty.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    // Before the store starts its thread and before any rank (NOTE [guardian]).
    Guardian guardian;
    // The job's secret: the one this braid-run was given (BRAID_JOB_SECRET), else a new one for this job.
    std::string secret = job_secret();
    if (secret.empty()) secret = generate_job_secret();
    StoreServer store("127.0.0.1", 0, StoreLimits{}, secret);
    Job job(options, {options.nprocs, fmt::format("127.0.0.1:{}", store.port()), new_job_id(), secret}, guardian);
    job.start();
    const int code = job.wait();
    drain_outputs();
    return code;
  } catch (const std::exception& error) {
    say(error.what());
    drain_outputs();
    return kExitLauncherError;
  }
}

}  // namespace braid::run

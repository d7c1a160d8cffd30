#include "launcher.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/store.hpp"

extern char** environ;

#ifndef BRAID_VERSION
#define BRAID_VERSION "unknown"
#endif

namespace braid::run {
namespace {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------------------------------------
// Command line. Parsed by hand rather than with a generic parser: options end at the program name, so
// the program's own options ("prog -n 3") pass through untouched, while an unknown option before the
// program must still be an error.

constexpr std::string_view kUsage = R"(usage: braid-run -n N [options] [--] program [args...]

Starts N ranks of `program` on this host, one GPU each, and serves their bootstrap store.
Each rank gets BRAID_RANK, BRAID_WORLD_SIZE, BRAID_LOCAL_RANK, BRAID_LOCAL_SIZE, BRAID_STORE_ADDR,
BRAID_JOB_ID and BRAID_JOB_SECRET (the one braid-run was given, else a new random one; the store serves only
clients that prove they know it); CUDA_VISIBLE_DEVICES is left as it is (a rank picks its GPU by
BRAID_LOCAL_RANK).
Ranks read stdin from /dev/null; each line they print is prefixed with "[rank] ".
When a rank fails, the others are stopped and braid-run exits with that rank's code (128 + signal if it
was killed by one). When a rank exits 0 and others still run --grace-s later, they are stopped and
braid-run exits with 124. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every rank and stop the job;
SIGUSR1 and SIGUSR2 are forwarded only. A signal ignored when braid-run started (nohup's SIGHUP) stays ignored.
Each rank runs in its own process group, and that group (the rank's process tree) ends with braid-run:
processes a rank leaves behind when it exits are stopped (SIGTERM, then SIGKILL after --timeout-s) before
braid-run exits, and if braid-run itself is killed (even by SIGKILL) a guardian process SIGKILLs every
rank's group. A descendant that leaves the group (setsid, setpgid) is not covered.

options:
  -n, --nprocs N    number of ranks to start (required, 1 to 16)
  --timeout-s S     when stopping ranks, SIGKILL them S seconds after the stopping signal (SIGTERM,
                    or the signal braid-run received) (default 5)
  --grace-s S       once a rank has exited 0, stop the others if they still run S seconds later
                    (default 300; 0: wait for them however long)
  --no-prefix       do not prefix output lines with the rank
  -h, --help        print this help and exit
  --version         print the version and exit
)";

ParsedArgs usage_error(const std::string& message) {
  fmt::print(stderr, "braid-run: {}\nRun 'braid-run --help' for usage.\n", message);
  return {std::nullopt, kExitUsage};
}

template <typename T>
std::optional<T> parse_number(const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

}  // namespace

ParsedArgs parse_args(int argc, char** argv) {
  LaunchOptions options;
  bool have_nprocs = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program ("-" alone is a name too)
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}", kUsage);
      return {std::nullopt, 0};
    }
    if (arg == "--version") {
      fmt::print("braid-run {}\n", BRAID_VERSION);
      return {std::nullopt, 0};
    }
    if (arg == "--no-prefix") {
      options.prefix = false;
      continue;
    }
    // Options with a value: "-n 4", "-n4", "--nprocs 4", "--nprocs=4".
    std::string name = arg;
    std::optional<std::string> value;
    if (arg.starts_with("--")) {
      if (size_t eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
      }
    } else if (arg.size() > 2) {
      name = arg.substr(0, 2);
      value = arg.substr(2);
    }
    if (name != "-n" && name != "--nprocs" && name != "--timeout-s" && name != "--grace-s") {
      return usage_error(fmt::format("unknown option '{}'", arg));
    }
    if (!value) {
      if (i + 1 >= argc) return usage_error(fmt::format("option '{}' needs a value", name));
      value = argv[++i];
    }
    if (name == "--timeout-s" || name == "--grace-s") {
      auto seconds = parse_number<double>(*value);
      if (!seconds || !std::isfinite(*seconds) || *seconds < 0) {
        return usage_error(fmt::format("{} must be a number of seconds >= 0, got '{}'", name, *value));
      }
      (name == "--timeout-s" ? options.timeout_s : options.grace_s) = *seconds;
    } else {
      auto n = parse_number<int>(*value);
      if (!n || *n < 1 || *n > kMaxRanks) {
        return usage_error(fmt::format("{} must be an integer from 1 to {} (the ranks of one host), got '{}'", name,
                                       kMaxRanks, *value));
      }
      options.nprocs = *n;
      have_nprocs = true;
    }
  }
  if (!have_nprocs) return usage_error("missing -n/--nprocs (the number of ranks)");
  if (i >= argc) return usage_error("missing the program to run");
  options.command.assign(argv + i, argv + argc);
  return {std::move(options), 0};
}

namespace {

// ------------------------------------------------------------------------------------------------
// Small system helpers.

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

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
void make_pipe(UniqueFd& read_end, UniqueFd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe2");
  read_end = UniqueFd(fds[0]);
  write_end = UniqueFd(fds[1]);
}

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
  void push(std::string_view text) {
    if (closed_) return;
    if (queued_.size() - sent_ + text.size() > kMaxQueued) {
      dropped_ += text.size();
      return;
    }
    queued_.append(text);
    flush();
  }

  // Writes what the fd takes without blocking, then drops what was written once it is most of the queue (each
  // byte moves O(1) times).
  void flush() {
    write_available();
    if (sent_ == queued_.size() || sent_ > queued_.size() / 2) {
      queued_.erase(0, sent_);
      sent_ = 0;
    }
  }

  // At exit: writes what the fd takes within `seconds`, then tells (where it can) what was dropped.
  void drain(double seconds) {
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

 private:
  void write_available() {
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

  void close() {
    closed_ = true;
    queued_.clear();
    sent_ = 0;
  }

  int fd_;
  std::string queued_;
  size_t sent_ = 0;     // prefix of queued_ already written
  size_t dropped_ = 0;  // bytes that found the queue full
  bool closed_ = false;
};

OutputSink& standard_output() {
  static OutputSink sink(STDOUT_FILENO);
  return sink;
}

OutputSink& standard_error() {
  static OutputSink sink(STDERR_FILENO);
  return sink;
}

// A message from braid-run itself, on stderr, as one piece so it does not split a rank's line.
void say(const std::string& message) { standard_error().push("braid-run: " + message + "\n"); }

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", signo);
}

// braid-run's exit code for a rank's wait status: its exit code, or 128 + signal (as a shell reports it).
int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

std::string describe_exit(int status) {
  return WIFSIGNALED(status) ? fmt::format("was killed by signal {}", signal_name(WTERMSIG(status)))
                             : fmt::format("exited with code {}", WEXITSTATUS(status));
}

// ------------------------------------------------------------------------------------------------
// The guardian: kills every rank's process group when braid-run is gone, however it went.

// NOTE [guardian]
// braid-run forks the guardian first, before the store's thread, any signal handler or any rank. The two
// share a SOCK_SEQPACKET socket pair: each rank, between its fork and its exec, sends its process-group id
// (its pid) on braid-run's end, so the guardian knows the group before the group can have a descendant;
// braid-run sends the id negated once it is done with the group, just before it reaps the group's leader
// (NOTE [group ids]). The guardian reads until end of file, which comes when every copy of braid-run's end is
// closed: braid-run exited in any way, SIGKILL included (a rank's copy is closed at its exec, or dies with it
// through PR_SET_PDEATHSIG). Then it SIGKILLs every group it still knows and exits. It keeps nothing of the
// job alive: its own process group and every signal blocked (a terminal's ^C or hangup reaches braid-run's
// group only), /dev/null for stdin, stdout and stderr, no other descriptor, "/" as its directory. After fork
// it makes only async-signal-safe calls.

// The guardian's end of the socket pair, after it has rearranged its descriptors.
constexpr int kGuardianChannelFd = 3;

// A group id to watch (> 0) or to forget (< 0), as one message. Async-signal-safe; the guardian being gone
// only loses the message (no SIGPIPE). The socket buffer holds far more messages than a job ever sends.
void send_group_message(int channel, int32_t message) {
  while (::send(channel, &message, sizeof message, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

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

class Guardian {
 public:
  Guardian() {
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

  // Closing the channel lets the guardian exit (it kills the groups it still knows: none after a normal
  // end); it is reaped here when it does so at once, else by whoever adopts it.
  ~Guardian() {
    channel_.reset();
    if (gone_) return;
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    while (::waitpid(pid_, nullptr, WNOHANG) == 0 && Clock::now() < deadline) {
      ::usleep(1000);
    }
  }

  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  pid_t pid() const { return pid_; }
  // braid-run's end, which each rank inherits until its exec to announce its group.
  int channel() const { return channel_.get(); }
  // The group is done: the guardian no longer kills it.
  void forget(pid_t group) const { send_group_message(channel_.get(), -static_cast<int32_t>(group)); }
  // braid-run reaped the guardian (it died early: nothing kills the ranks if braid-run is killed now).
  void mark_gone() { gone_ = true; }

 private:
  pid_t pid_ = -1;
  UniqueFd channel_;
  bool gone_ = false;
};

// ------------------------------------------------------------------------------------------------
// Processes, as /proc shows them: who is left in a rank's group, and braid-run's zombie children.

struct ProcessEntry {
  pid_t pid;
  pid_t parent;
  pid_t group;
  char state;  // 'Z' (zombie) or 'X' (dead): gone
};

// Every process of this pid namespace, or nullopt when /proc cannot be read. O(processes on the host); used
// when a leader exits and, rate-limited, while groups are being stopped.
std::optional<std::vector<ProcessEntry>> list_processes() {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return std::nullopt;
  std::vector<ProcessEntry> processes;
  while (const dirent* entry = ::readdir(proc)) {
    auto pid = parse_number<pid_t>(entry->d_name);
    if (!pid || *pid <= 0) continue;
    UniqueFd stat(::open(fmt::format("/proc/{}/stat", *pid).c_str(), O_RDONLY | O_CLOEXEC));
    if (!stat) continue;  // it exited meanwhile
    char text[512];
    const ssize_t n = ::read(stat.get(), text, sizeof text - 1);
    if (n <= 0) continue;
    text[n] = '\0';
    const char* name_end = std::strrchr(text, ')');  // the command name may hold anything, ')' included
    ProcessEntry process{*pid, 0, 0, '?'};
    if (name_end && std::sscanf(name_end + 1, " %c %d %d", &process.state, &process.parent, &process.group) == 3) {
      processes.push_back(process);
    }
  }
  ::closedir(proc);
  return processes;
}

bool is_gone(const ProcessEntry& process) { return process.state == 'Z' || process.state == 'X'; }

// ------------------------------------------------------------------------------------------------
// Signals. Handlers only set a flag and write a byte to a self-pipe that the poll loop watches, so a
// signal arriving at any moment (even just before poll()) wakes the loop; all real work happens there.

// Forwarded to every rank, and the job stops (braid-run exits with 128 + the signal).
constexpr int kStoppingSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
// Forwarded to every rank only: the ranks decide what they mean.
constexpr int kPassedSignals[] = {SIGUSR1, SIGUSR2};
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

class SignalPipe {
 public:
  SignalPipe() {
    make_pipe(read_end_, write_end_);
    for (const UniqueFd* end : {&read_end_, &write_end_}) {
      ::fcntl(end->get(), F_SETFL, ::fcntl(end->get(), F_GETFL) | O_NONBLOCK);
    }
    g_wake_fd = write_end_.get();
    for (int signo : kHandledSignals) install(signo);
  }

  ~SignalPipe() {
    for (int signo : kHandledSignals) ::sigaction(signo, &saved_[signo], nullptr);
    g_wake_fd = -1;
  }

  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_end_.get(); }

  void drain() {
    char buffer[256];
    while (::read(read_end_.get(), buffer, sizeof buffer) > 0) {
    }
  }

  // Whether `signo` arrived since the last call.
  bool take(int signo) {
    if (!g_pending[signo]) return false;
    g_pending[signo] = 0;
    return true;
  }

  // In a forked child before exec: the dispositions braid-run started with (async-signal-safe).
  void restore_in_child() const {
    for (int signo : kHandledSignals) ::sigaction(signo, &saved_[signo], nullptr);
  }

 private:
  void install(int signo) {
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

  UniqueFd read_end_, write_end_;
  struct sigaction saved_[NSIG] {};
};

// ------------------------------------------------------------------------------------------------
// Output. One LineForwarder per rank and stream reads the rank's pipe and writes whole lines, prefixed,
// to braid-run's own stdout or stderr. Only braid-run writes there, one write() per batch of whole
// lines, so lines of different ranks never interleave mid-line.

class LineForwarder {
 public:
  // A line longer than this without a newline is cut, so one rank cannot make braid-run buffer without bound.
  static constexpr size_t kMaxLine = 64 * 1024;

  LineForwarder(UniqueFd pipe, OutputSink& target, std::string prefix)
      : pipe_(std::move(pipe)), target_(&target), prefix_(std::move(prefix)) {
    ::fcntl(pipe_.get(), F_SETFL, ::fcntl(pipe_.get(), F_GETFL) | O_NONBLOCK);
  }

  int fd() const { return pipe_.get(); }
  bool open() const { return static_cast<bool>(pipe_); }

  // Reads once (or, with until_empty, until the pipe has nothing more now) and forwards whole lines.
  // At end of file, forwards a partial last line and closes the pipe.
  void read_available(bool until_empty) {
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

  void close_and_flush() {
    if (!pending_.empty()) {
      pending_ += '\n';
      forward_lines();
    }
    pipe_.reset();
  }

 private:
  void forward_lines() {
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

  UniqueFd pipe_;
  OutputSink* target_;
  std::string prefix_;
  std::string pending_;  // bytes after the last newline seen
};

// ------------------------------------------------------------------------------------------------
// Ranks.

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

ExecPlan make_exec_plan(int rank, const JobInfo& job, const std::vector<std::string>& command) {
  ExecPlan plan;
  plan.argv_storage = command;
  plan.env_storage = rank_environment(rank, job);
  plan.argv = ExecPlan::pointers(plan.argv_storage);
  plan.envp = ExecPlan::pointers(plan.env_storage);
  plan.cannot_run = fmt::format("braid-run: cannot run '{}': ", command[0]);
  return plan;
}

// The forked child: own process group (so a signal to the group reaches the rank's whole process tree),
// the group announced to the guardian, stdio onto the pipes, braid-run's original signal state, then exec.
// Only async-signal-safe calls.
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

// A wait status (as waitpid gives it) from waitid's report of an exit.
int wait_status_of(const siginfo_t& info) {
  if (info.si_code == CLD_EXITED) return (info.si_status & 0xff) << 8;
  return (info.si_status & 0x7f) | (info.si_code == CLD_DUMPED ? 0x80 : 0);
}

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

// braid-run, end to end: each test runs the built launcher on small /bin/sh scripts and checks its output,
// exit code and timing, and that no rank outlives it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A running braid-run whose stdout and stderr the test reads.
struct Launch {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
};

struct Outcome {
  int exit_code = -1;  // braid-run's exit code; -signal if it was killed by one
  std::string out, err;
};

Launch start_braid_run(const std::vector<std::string>& args) {
  std::vector<std::string> storage = {BRAID_RUN_PATH};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : storage) argv.push_back(arg.data());
  argv.push_back(nullptr);

  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(126);
  }
  close(out[1]);
  close(err[1]);
  return {pid, out[0], err[0]};
}

// Reads both streams to their end, then reaps braid-run.
Outcome finish(const Launch& launch) {
  Outcome outcome;
  pollfd fds[2] = {{launch.out_fd, POLLIN, 0}, {launch.err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&outcome.out, &outcome.err};
  int open_streams = 2;
  while (open_streams > 0) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_streams;
      }
    }
  }
  int status = 0;
  waitpid(launch.pid, &status, 0);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  return outcome;
}

Outcome run_braid_run(const std::vector<std::string>& args) { return finish(start_braid_run(args)); }

// braid-run with `nprocs` ranks, each running `script` under /bin/sh.
Outcome run_script(int nprocs, const std::string& script, std::vector<std::string> extra_options = {}) {
  std::vector<std::string> args = {"-n", std::to_string(nprocs)};
  args.insert(args.end(), extra_options.begin(), extra_options.end());
  args.insert(args.end(), {"--", "/bin/sh", "-c", script});
  return run_braid_run(args);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// Whether `pid` is a live process (a zombie counts as gone).
bool process_alive(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  if (text.empty()) return false;
  size_t close_paren = text.rfind(')');
  return close_paren == std::string::npos || text.substr(close_paren + 2, 1) != "Z";
}

bool wait_for_files(const std::vector<fs::path>& paths, double timeout_s) {
  auto start = Clock::now();
  while (seconds_since(start) < timeout_s) {
    if (std::all_of(paths.begin(), paths.end(), [](const fs::path& p) { return fs::exists(p); })) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A scratch directory per test for marker files.
class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "braid-launcher-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(LauncherTest, PrefixesEveryLineOfEveryRankOnce) {
  constexpr int kRanks = 4, kLines = 200;
  // Each line goes out in two writes, so braid-run sees partial lines and must hold them back.
  Outcome outcome = run_script(kRanks, fmt::format(R"(
    i=0
    while [ $i -lt {} ]; do
      printf 'out %s %s ' $BRAID_RANK $i; printf 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n'
      printf 'err %s %s\n' $BRAID_RANK $i >&2
      i=$((i + 1))
    done)", kLines));
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;

  for (auto [text, kind] : {std::pair{&outcome.out, "out"}, std::pair{&outcome.err, "err"}}) {
    std::set<std::pair<int, int>> seen;
    std::string tail = std::string(kind) == "out" ? " x{48}" : "";
    std::regex line_format(fmt::format(R"(\[(\d+)\] {} (\d+) (\d+){})", kind, tail));
    for (const std::string& line : lines_of(*text)) {
      std::smatch match;
      ASSERT_TRUE(std::regex_match(line, match, line_format)) << "malformed " << kind << " line: " << line;
      int prefix = std::stoi(match[1]), rank = std::stoi(match[2]), index = std::stoi(match[3]);
      EXPECT_EQ(prefix, rank) << line;
      EXPECT_TRUE(seen.emplace(rank, index).second) << "line seen twice: " << line;
    }
    EXPECT_EQ(seen.size(), size_t{kRanks * kLines}) << kind;
  }
}

TEST_F(LauncherTest, FlushesPartialLastLineAndHonoursNoPrefix) {
  Outcome prefixed = run_script(1, "printf 'no newline'");
  EXPECT_EQ(prefixed.exit_code, 0);
  EXPECT_EQ(prefixed.out, "[0] no newline\n");

  Outcome bare = run_script(2, "echo plain", {"--no-prefix"});
  EXPECT_EQ(bare.exit_code, 0);
  EXPECT_EQ(bare.out, "plain\nplain\n");
}

// Per-rank variables, by rank, from one launch.
std::map<int, std::map<std::string, std::string>> rendezvous_variables(int nprocs) {
  Outcome outcome = run_script(nprocs, R"(
    for v in BRAID_RANK BRAID_WORLD_SIZE BRAID_LOCAL_RANK BRAID_LOCAL_SIZE BRAID_STORE_ADDR BRAID_JOB_ID BRAID_JOB_SECRET; do
      eval "echo $v=\$$v"
    done)");
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  std::map<int, std::map<std::string, std::string>> variables;
  std::regex line_format(R"(\[(\d+)\] (\w+)=(.*))");
  for (const std::string& line : lines_of(outcome.out)) {
    std::smatch match;
    if (std::regex_match(line, match, line_format)) variables[std::stoi(match[1])][match[2]] = match[3];
  }
  return variables;
}

TEST_F(LauncherTest, SetsRendezvousVariablesPerRank) {
  constexpr int kRanks = 3;
  auto first = rendezvous_variables(kRanks);
  ASSERT_EQ(first.size(), size_t{kRanks});
  for (auto& [rank, vars] : first) {
    EXPECT_EQ(vars["BRAID_RANK"], std::to_string(rank));
    EXPECT_EQ(vars["BRAID_LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(vars["BRAID_WORLD_SIZE"], std::to_string(kRanks));
    EXPECT_EQ(vars["BRAID_LOCAL_SIZE"], std::to_string(kRanks));
    EXPECT_TRUE(std::regex_match(vars["BRAID_STORE_ADDR"], std::regex(R"(127\.0\.0\.1:[1-9]\d*)")))
        << vars["BRAID_STORE_ADDR"];
    EXPECT_EQ(vars["BRAID_STORE_ADDR"], first[0]["BRAID_STORE_ADDR"]);
    EXPECT_FALSE(vars["BRAID_JOB_ID"].empty());
    EXPECT_EQ(vars["BRAID_JOB_ID"], first[0]["BRAID_JOB_ID"]);
    // A new secret for the job: 32 random bytes in hex, the same for every rank.
    EXPECT_TRUE(std::regex_match(vars["BRAID_JOB_SECRET"], std::regex("[0-9a-f]{64}"))) << vars["BRAID_JOB_SECRET"];
    EXPECT_EQ(vars["BRAID_JOB_SECRET"], first[0]["BRAID_JOB_SECRET"]);
  }
  auto second = rendezvous_variables(kRanks);
  ASSERT_EQ(second.size(), size_t{kRanks});
  EXPECT_NE(second[0]["BRAID_JOB_ID"], first[0]["BRAID_JOB_ID"]);
  EXPECT_NE(second[0]["BRAID_JOB_SECRET"], first[0]["BRAID_JOB_SECRET"]);
}

TEST_F(LauncherTest, PassesOnTheJobSecretItWasGiven) {
  setenv("BRAID_JOB_SECRET", "a-secret-of-the-caller-0123456789", 1);
  Outcome given = run_script(2, "echo secret=$BRAID_JOB_SECRET");
  setenv("BRAID_JOB_SECRET", "short", 1);
  Outcome too_short = run_script(2, "echo started");
  unsetenv("BRAID_JOB_SECRET");
  EXPECT_EQ(given.exit_code, 0) << given.err;
  std::vector<std::string> lines = lines_of(given.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[0] secret=a-secret-of-the-caller-0123456789",
                                              "[1] secret=a-secret-of-the-caller-0123456789"}));
  // A secret too short to be one is refused before any rank starts, naming the variable but not the value.
  EXPECT_NE(too_short.exit_code, 0);
  EXPECT_EQ(too_short.out, "");
  EXPECT_NE(too_short.err.find("BRAID_JOB_SECRET"), std::string::npos) << too_short.err;
  EXPECT_EQ(too_short.err.find("short"), std::string::npos) << too_short.err;
}

TEST_F(LauncherTest, OverridesInheritedRendezvousVariables) {
  setenv("BRAID_RANK", "99", 1);
  Outcome outcome = run_script(2, "echo rank=$BRAID_RANK");
  unsetenv("BRAID_RANK");
  EXPECT_EQ(outcome.exit_code, 0);
  std::vector<std::string> lines = lines_of(outcome.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[0] rank=0", "[1] rank=1"}));
}

// Whether this host's bash can open TCP connections through /dev/tcp (a build option of bash).
bool bash_dev_tcp_works() {
  if (access("/bin/bash", X_OK) != 0) return false;
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  bool ok = bind(listener, reinterpret_cast<sockaddr*>(&address), length) == 0 && listen(listener, 1) == 0 &&
            getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  if (ok) {
    std::string command =
        fmt::format("/bin/bash -c 'exec 3<>/dev/tcp/127.0.0.1/{}' 2>/dev/null", ntohs(address.sin_port));
    ok = std::system(command.c_str()) == 0;
  }
  close(listener);
  return ok;
}

TEST_F(LauncherTest, RanksCanReachTheStore) {
  if (!bash_dev_tcp_works()) GTEST_SKIP() << "/bin/bash with /dev/tcp support is needed to probe the store port";
  Outcome outcome = run_braid_run(
      {"-n", "2", "/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${BRAID_STORE_ADDR##*:} && echo connected"});
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  std::vector<std::string> lines = lines_of(outcome.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[0] connected", "[1] connected"}));
}

TEST_F(LauncherTest, ExitsZeroWhenAllRanksSucceed) {
  Outcome outcome = run_script(4, "exit 0");
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_EQ(outcome.err, "");
}

TEST_F(LauncherTest, FailingRankStopsTheOthersAndSetsTheExitCode) {
  // Sleepers record their pid, and would leave a marker if they outlived their sleep.
  auto start = Clock::now();
  Outcome outcome = run_script(4, fmt::format(R"(
    if [ $BRAID_RANK = 2 ]; then exit 3; fi
    echo $$ > {dir}/pid$BRAID_RANK
    (sleep 10; touch {dir}/marker$BRAID_RANK)  # a subprocess: stopping must reach the rank's whole tree
  )", fmt::arg("dir", dir_.string())));
  double elapsed = seconds_since(start);
  EXPECT_EQ(outcome.exit_code, 3);
  EXPECT_LT(elapsed, 8.0);  // well before the sleepers would end, with room for a loaded machine's process starts
  EXPECT_NE(outcome.err.find("braid-run: rank 2 exited with code 3"), std::string::npos) << outcome.err;

  for (int rank : {0, 1, 3}) {
    std::ifstream pid_file(path(fmt::format("pid{}", rank)));
    pid_t pid = 0;
    if (pid_file >> pid) EXPECT_FALSE(process_alive(pid)) << "rank " << rank << " survived";
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(10.5 - elapsed));
  for (int rank : {0, 1, 3}) EXPECT_FALSE(fs::exists(path(fmt::format("marker{}", rank)))) << rank;
}

TEST_F(LauncherTest, RankKilledBySignalGives128PlusSignal) {
  // The others are stopped, not waited for: well inside their sleep even if one needed the SIGKILL.
  auto start = Clock::now();
  Outcome outcome = run_script(3, "if [ $BRAID_RANK = 1 ]; then kill -KILL $$; fi; sleep 30", {"--timeout-s", "1"});
  EXPECT_EQ(outcome.exit_code, 128 + SIGKILL) << outcome.err;
  EXPECT_LT(seconds_since(start), 10.0) << outcome.err;
  EXPECT_NE(outcome.err.find("braid-run: rank 1 was killed by signal SIGKILL"), std::string::npos) << outcome.err;
}

TEST_F(LauncherTest, SigtermToLauncherStopsRanks) {
  // Each rank's sleeper is a child process that records its pid.
  Launch launch = start_braid_run(
      {"-n", "3", "--", "/bin/sh", "-c",
       fmt::format("sh -c 'echo $$ > {}/pid$BRAID_RANK.tmp; exec sleep 30' && echo done", dir_.string())});
  ASSERT_TRUE(wait_for_files({path("pid0.tmp"), path("pid1.tmp"), path("pid2.tmp")}, 10.0));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the pid writes finish
  auto start = Clock::now();
  kill(launch.pid, SIGTERM);
  Outcome outcome = finish(launch);
  EXPECT_EQ(outcome.exit_code, 128 + SIGTERM) << outcome.err;
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_NE(outcome.err.find("SIGTERM"), std::string::npos) << outcome.err;
  EXPECT_EQ(outcome.out, "");
  for (int rank = 0; rank < 3; ++rank) {
    std::ifstream pid_file(path(fmt::format("pid{}.tmp", rank)));
    pid_t pid = 0;
    ASSERT_TRUE(pid_file >> pid) << rank;
    EXPECT_FALSE(process_alive(pid)) << "rank " << rank << "'s sleeper survived";
  }
}

// Nobody reads braid-run's stdout or stderr (a stuck pager, a pipe nobody drains) while its ranks print
// without pause: braid-run never blocks writing, so SIGTERM still stops the job, and it exits once its final
// output has had its few seconds.
TEST_F(LauncherTest, UnreadOutputDoesNotKeepItFromStopping) {
  Launch launch = start_braid_run(
      {"-n", "2", "--", "/bin/sh", "-c", "while :; do echo 0123456789012345678901234567890123456789; done"});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // both pipes are full by now
  const auto start = Clock::now();
  kill(launch.pid, SIGTERM);
  int status = 0;
  bool exited = false;
  while (!exited && seconds_since(start) < 20.0) {
    exited = waitpid(launch.pid, &status, WNOHANG) == launch.pid;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds = seconds_since(start);
  if (!exited) {
    kill(launch.pid, SIGKILL);
    waitpid(launch.pid, &status, 0);
  }
  close(launch.out_fd);
  close(launch.err_fd);
  ASSERT_TRUE(exited) << "braid-run was still running 20 s after SIGTERM";
  EXPECT_LT(seconds, 10.0);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
}

TEST_F(LauncherTest, RankIgnoringSigtermIsKilledAfterTimeout) {
  // Rank 1 ignores SIGTERM (as does its sleep, which inherits that); rank 0 fails once rank 1 is set up.
  auto start = Clock::now();
  Outcome outcome = run_script(2, fmt::format(R"(
    if [ $BRAID_RANK = 1 ]; then trap '' TERM; touch {0}/ready1; sleep 30; touch {0}/marker1; fi
    while [ ! -e {0}/ready1 ]; do sleep 0.02; done
    exit 5)", dir_.string()), {"--timeout-s", "1"});
  double elapsed = seconds_since(start);
  EXPECT_EQ(outcome.exit_code, 5) << outcome.err;
  EXPECT_GE(elapsed, 1.0);
  EXPECT_LT(elapsed, 4.0);
  EXPECT_NE(outcome.err.find("SIGKILL"), std::string::npos) << outcome.err;
  EXPECT_FALSE(fs::exists(path("marker1")));
}

// Ranks that record their pid, then sleep as that very process (exec), so the pid is the rank's.
Launch start_sleeping_ranks(int nprocs, const std::string& dir, const std::string& setup = "") {
  return start_braid_run({"-n", std::to_string(nprocs), "--", "/bin/sh", "-c",
                          fmt::format("{}echo $$ > {}/pid$BRAID_RANK.tmp; exec sleep 30", setup, dir)});
}

std::vector<pid_t> read_pids(const fs::path& dir, int nprocs) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nprocs; ++rank) {
    std::ifstream file(dir / fmt::format("pid{}.tmp", rank));
    pid_t pid = 0;
    file >> pid;
    pids.push_back(pid);
  }
  return pids;
}

bool all_gone_within(const std::vector<pid_t>& pids, double timeout_s) {
  auto start = Clock::now();
  while (seconds_since(start) < timeout_s) {
    if (std::none_of(pids.begin(), pids.end(), [](pid_t pid) { return pid > 0 && process_alive(pid); })) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST_F(LauncherTest, RanksDieWithTheLauncherEvenByItsSigkill) {
  Launch launch = start_sleeping_ranks(2, dir_.string());
  ASSERT_TRUE(wait_for_files({path("pid0.tmp"), path("pid1.tmp")}, 10.0));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the pid writes finish
  const std::vector<pid_t> pids = read_pids(dir_, 2);
  ASSERT_GT(pids[0], 0);
  ASSERT_GT(pids[1], 0);
  kill(launch.pid, SIGKILL);
  Outcome outcome = finish(launch);
  EXPECT_EQ(outcome.exit_code, -SIGKILL);
  EXPECT_TRUE(all_gone_within(pids, 5.0)) << "a rank outlived braid-run";
}

// Pids that the ranks' scripts wrote to `name`0, `name`1, ... (each file renamed into place once whole).
std::vector<pid_t> read_named_pids(const fs::path& dir, const std::string& name, int nprocs) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nprocs; ++rank) {
    std::ifstream file(dir / fmt::format("{}{}", name, rank));
    pid_t pid = 0;
    file >> pid;
    pids.push_back(pid);
  }
  return pids;
}

// Kills whatever of `pids` a failed check left running, so a failure does not leak sleepers.
void kill_survivors(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    if (pid > 0 && process_alive(pid)) kill(pid, SIGKILL);
  }
}

// A script that starts a background worker, records its pid, and waits for it.
constexpr const char* kWorkerScript = R"(sleep 1000 &
file="$WORKER_DIR/worker$BRAID_RANK"
echo $! > "$file.part" && mv "$file.part" "$file"
)";

// The rank is a wrapper script whose worker is its child, so the rank's own death signal does not reach
// it: the guardian kills the rank's whole process group when braid-run is SIGKILLed.
TEST_F(LauncherTest, RankProcessTreeDiesWithTheLauncherBySigkill) {
  const fs::path script = dir_ / "rank.sh";
  std::ofstream(script) << "#!/bin/sh\n" << kWorkerScript << "wait\n";
  fs::permissions(script, fs::perms::owner_all);
  setenv("WORKER_DIR", dir_.c_str(), 1);
  Launch launch = start_braid_run({"-n", "2", "--", script.string()});
  unsetenv("WORKER_DIR");
  const bool started = wait_for_files({path("worker0"), path("worker1")}, 10.0);
  const std::vector<pid_t> workers = read_named_pids(dir_, "worker", 2);
  kill(launch.pid, SIGKILL);
  Outcome outcome = finish(launch);
  const bool gone = all_gone_within(workers, 2.0);
  kill_survivors(workers);
  ASSERT_TRUE(started) << outcome.err;
  EXPECT_EQ(outcome.exit_code, -SIGKILL);
  for (pid_t worker : workers) EXPECT_GT(worker, 0);
  EXPECT_TRUE(gone) << "a rank's worker outlived braid-run";
}

// A rank exits 0 while its background worker still runs: braid-run stops the worker (it is in the rank's
// process group) before it exits, and still exits 0.
TEST_F(LauncherTest, LeftoversOfRanksThatExitedZeroAreStoppedBeforeItExits) {
  setenv("WORKER_DIR", dir_.c_str(), 1);
  const auto start = Clock::now();
  Outcome outcome = run_script(2, std::string(kWorkerScript) + "exit 0\n");
  const double elapsed = seconds_since(start);
  unsetenv("WORKER_DIR");
  const std::vector<pid_t> workers = read_named_pids(dir_, "worker", 2);
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_LT(elapsed, 4.0);
  EXPECT_NE(outcome.err.find("exited and left processes in their process group; stopping them"), std::string::npos)
      << outcome.err;
  const bool gone = std::none_of(workers.begin(), workers.end(), process_alive);  // already, not eventually
  kill_survivors(workers);
  for (pid_t worker : workers) EXPECT_GT(worker, 0);
  EXPECT_TRUE(gone) << "a rank's worker outlived braid-run";
}

TEST_F(LauncherTest, SigquitToLauncherStopsRanks) {
  Launch launch = start_sleeping_ranks(2, dir_.string());
  ASSERT_TRUE(wait_for_files({path("pid0.tmp"), path("pid1.tmp")}, 10.0));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::vector<pid_t> pids = read_pids(dir_, 2);
  kill(launch.pid, SIGQUIT);
  Outcome outcome = finish(launch);
  EXPECT_EQ(outcome.exit_code, 128 + SIGQUIT) << outcome.err;
  EXPECT_NE(outcome.err.find("SIGQUIT"), std::string::npos) << outcome.err;
  EXPECT_TRUE(all_gone_within(pids, 5.0));
}

TEST_F(LauncherTest, Sigusr1IsForwardedWithoutStoppingTheJob) {
  // Each rank exits 0 once it got SIGUSR1 (the trap runs between sleeps).
  Launch launch = start_braid_run(
      {"-n", "2", "--", "/bin/sh", "-c",
       fmt::format("trap 'touch {0}/usr1$BRAID_RANK; exit 0' USR1; touch {0}/ready$BRAID_RANK; "
                   "while true; do sleep 0.05; done",
                   dir_.string())});
  ASSERT_TRUE(wait_for_files({path("ready0"), path("ready1")}, 10.0));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(launch.pid, SIGUSR1);
  Outcome outcome = finish(launch);
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_TRUE(fs::exists(path("usr10")));
  EXPECT_TRUE(fs::exists(path("usr11")));
}

TEST_F(LauncherTest, RanksStillRunningGraceSecondsAfterOneExitedZeroAreStopped) {
  auto start = Clock::now();
  Outcome outcome = run_script(3, "if [ $BRAID_RANK != 0 ]; then exec sleep 30; fi; exit 0", {"--grace-s", "0.5"});
  const double elapsed = seconds_since(start);
  EXPECT_EQ(outcome.exit_code, 124) << outcome.err;
  EXPECT_GE(elapsed, 0.5);
  EXPECT_LT(elapsed, 5.0);
  EXPECT_NE(outcome.err.find("rank 0 exited 0"), std::string::npos) << outcome.err;
  EXPECT_NE(outcome.err.find("rank(s) 1, 2 still run (--grace-s)"), std::string::npos) << outcome.err;
  // The default waits: ranks that finish one after another within it succeed.
  EXPECT_EQ(run_script(2, "if [ $BRAID_RANK = 1 ]; then sleep 0.3; fi; exit 0").exit_code, 0);
}

TEST_F(LauncherTest, MissingProgramExits127) {
  Outcome outcome = run_braid_run({"-n", "2", "/nonexistent/braid-test-program"});
  EXPECT_EQ(outcome.exit_code, 127);
  EXPECT_NE(outcome.err.find("braid-run: cannot run '/nonexistent/braid-test-program': No such file or directory"),
            std::string::npos)
      << outcome.err;
}

TEST_F(LauncherTest, RejectsBadArgumentsWithExitCode2) {
  const std::vector<std::vector<std::string>> bad = {
      {},                                  // nothing
      {"true"},                            // no -n
      {"-n", "2"},                         // no program
      {"-n"},                              // -n without value
      {"-n", "0", "true"},                 // n < 1
      {"-n", "-3", "true"},                // n < 1
      {"-n", "two", "true"},               // not a number
      {"-n", "2x", "true"},                // trailing junk
      {"--bogus", "-n", "2", "true"},      // unknown option
      {"-n", "2", "--timeout-s", "-1", "true"},  // negative grace
      {"-n", "17", "true"},                // more ranks than one host serves
      {"-n", "2", "--grace-s", "-1", "true"},    // negative grace after a success
      {"-n", "2", "--grace-s", "soon", "true"},  // not a number
  };
  for (const auto& args : bad) {
    Outcome outcome = run_braid_run(args);
    std::string shown = fmt::format("{}", fmt::join(args, " "));
    EXPECT_EQ(outcome.exit_code, 2) << shown;
    EXPECT_NE(outcome.err.find("braid-run: "), std::string::npos) << shown;
    EXPECT_EQ(outcome.out, "") << shown;
  }
}

TEST_F(LauncherTest, AcceptsOptionSpellingsAndPassesProgramOptionsThrough) {
  // "-n" after the program name belongs to the program.
  Outcome outcome = run_braid_run({"--nprocs=2", "--timeout-s=0.5", "/bin/echo", "-n", "x"});
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(lines_of(outcome.out).size(), 2u);
  EXPECT_EQ(run_braid_run({"-n1", "true"}).exit_code, 0);
}

TEST_F(LauncherTest, HelpAndVersion) {
  Outcome help = run_braid_run({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("usage: braid-run -n N"), std::string::npos);
  Outcome version = run_braid_run({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_TRUE(version.out.starts_with("braid-run ")) << version.out;
}

// docs/braid-run.md lists every option --help prints, each in backquotes, and no option --help lacks.
TEST_F(LauncherTest, TheDocsListEveryOptionOfHelp) {
  Outcome help = run_braid_run({"--help"});
  ASSERT_EQ(help.exit_code, 0);
  std::ifstream file(std::string(BRAID_SOURCE_DIR) + "/docs/braid-run.md");
  ASSERT_TRUE(file.good()) << "docs/braid-run.md is missing";
  std::stringstream doc;
  doc << file.rdbuf();
  const std::regex option(R"((^|[ ,`])(--[a-z][a-z-]*|-[a-z])\b)");
  auto options_of = [&](const std::string& text) {
    std::set<std::string> found;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), option); it != std::sregex_iterator(); ++it) {
      found.insert((*it)[2]);
    }
    return found;
  };
  const std::string listed = help.out.substr(help.out.find("options:"));
  const std::set<std::string> in_help = options_of(listed);
  EXPECT_GE(in_help.size(), 6u) << listed;
  for (const std::string& name : in_help) {
    EXPECT_NE(doc.str().find("`" + name), std::string::npos) << name << " (braid-run --help) is not in docs/braid-run.md";
  }
  const std::string table = doc.str().substr(doc.str().find("## Options"));
  for (const std::string& name : options_of(table.substr(0, table.find("\n\n")))) {
    EXPECT_TRUE(in_help.count(name) > 0) << name << " (docs/braid-run.md) is not an option of braid-run --help";
  }
}

}  // namespace

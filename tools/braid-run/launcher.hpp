// braid-run: starts N ranks of a program on this host, serves their bootstrap store, prefixes their output
// with the rank, forwards signals, tears the job down when one rank fails, and ends each rank's process tree
// (its process group) with itself, however it exits.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace braid::run {

// Exit codes of braid-run itself (a rank's own code is passed through unchanged).
constexpr int kExitLauncherError = 1;  // braid-run could not start the job (store, pipes, fork)
constexpr int kExitUsage = 2;          // bad command line
constexpr int kExitGraceExpired = 124;  // a rank exited 0 and the others were still running --grace-s later

// The most ranks braid-run starts: one host's GPUs, as many as a communicator takes.
constexpr int kMaxRanks = 16;

struct LaunchOptions {
  int nprocs = 0;                    // ranks to start (>= 1)
  double timeout_s = 5.0;            // grace between SIGTERM and SIGKILL when stopping ranks or leftovers
  double grace_s = 300.0;            // once a rank exited 0, how long the others may still run (0: no limit)
  bool prefix = true;                // prefix every output line with "[rank] "
  std::vector<std::string> command;  // program and its arguments
};

// Result of parsing the command line: options to launch with, or (for --help, --version and errors,
// which have already been printed) the code to exit with right away.
struct ParsedArgs {
  std::optional<LaunchOptions> options;
  int exit_code = 0;
};

// Parses argv[1..]. Everything from the program name on (or after "--") belongs to the program.
ParsedArgs parse_args(int argc, char** argv);

// Runs the job to completion and returns braid-run's exit code: 0 when every rank exits 0; the first
// failing rank's code (128 + signal when it was killed by one); 128 + signal when braid-run itself was
// interrupted first; kExitGraceExpired when ranks still ran --grace-s after one exited 0. Processes left in a
// rank's group are stopped before it returns.
int launch(const LaunchOptions& options);

}  // namespace braid::run

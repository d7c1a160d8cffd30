// braid-run's command line: its --help text and parse_args, which turns argv into LaunchOptions (or an exit
// code).
#include "launcher.hpp"

#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "parse_number.hpp"

#ifndef BRAID_VERSION
#define BRAID_VERSION "unknown"
#endif

namespace braid::run {
namespace {

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

}  // namespace braid::run

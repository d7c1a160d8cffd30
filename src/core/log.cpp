#include "core/log.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "braid/error.hpp"
#include "core/config.hpp"

namespace braid {
namespace {

thread_local int t_log_rank = -1;

LogLevel parse_level() {
  std::string name;
  try {
    name = Config::get().string("BRAID_LOG_LEVEL").value_or("warn");
  } catch (const Error& error) {
    std::fprintf(stderr, "braid: %s; using warn\n", error.what());
    return LogLevel::kWarn;
  }
  if (name == "error") return LogLevel::kError;
  if (name == "info") return LogLevel::kInfo;
  if (name == "debug") return LogLevel::kDebug;
  if (name == "trace") return LogLevel::kTrace;
  return LogLevel::kWarn;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kTrace: return "TRACE";
  }
  return "?";
}

const std::string& host_name() {
  static const std::string name = [] {
    char buffer[256] = {};
    if (gethostname(buffer, sizeof(buffer) - 1) != 0) return std::string("?");
    return std::string(buffer);
  }();
  return name;
}

std::string rank_text_impl() {
  if (t_log_rank >= 0) return std::to_string(t_log_rank);
  // Before a communicator exists: the process's rank as a launcher set it.
  for (const char* variable : {"BRAID_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(variable)) return value;
  }
  return "?";
}

}  // namespace

bool log_enabled(LogLevel level) {
  static const LogLevel threshold = [] {
    const LogLevel parsed = parse_level();
    // The configuration's warnings go out here, once the level is known, and through log_line: a BRAID_WARN
    // would call back into this initialiser, and a thread re-entering its own static initialisation waits on
    // itself for ever (any process started with an unknown BRAID_* variable set would hang).
    if (LogLevel::kWarn <= parsed) {
      for (const std::string& warning : Config::environment_warnings()) log_line(LogLevel::kWarn, warning);
    }
    return parsed;
  }();
  return level <= threshold;
}

void log_line(LogLevel level, std::string_view message) {
  std::string line = fmt::format("braid[{}:{}] {}: {}\n", host_name(), current_rank_text(), level_name(level), message);
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write per line: lines of threads do not interleave
}

void set_log_rank(int rank) { t_log_rank = rank; }

std::string current_rank_text() { return rank_text_impl(); }

}  // namespace braid

// Logging to stderr, filtered by BRAID_LOG_LEVEL, every line prefixed with host and rank.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace braid {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

bool log_enabled(LogLevel level);
void log_line(LogLevel level, std::string_view message);

// Rank shown in this thread's log lines (several ranks may be threads of one process).
// -1: fall back to the process's rank from the environment, or "?".
void set_log_rank(int rank);

// This thread's rank as shown in log lines and error messages.
std::string current_rank_text();

}  // namespace braid

#define BRAID_LOG(level, ...)                                                        \
  do {                                                                               \
    if (::braid::log_enabled(level)) ::braid::log_line(level, fmt::format(__VA_ARGS__)); \
  } while (0)
#define BRAID_ERROR(...) BRAID_LOG(::braid::LogLevel::kError, __VA_ARGS__)
#define BRAID_WARN(...) BRAID_LOG(::braid::LogLevel::kWarn, __VA_ARGS__)
#define BRAID_INFO(...) BRAID_LOG(::braid::LogLevel::kInfo, __VA_ARGS__)
#define BRAID_DEBUG(...) BRAID_LOG(::braid::LogLevel::kDebug, __VA_ARGS__)
#define BRAID_TRACE(...) BRAID_LOG(::braid::LogLevel::kTrace, __VA_ARGS__)

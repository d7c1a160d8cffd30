// The one table of BRAID_* environment variables, parsed in one place.
// docs/config.md documents the same table; a cpu test keeps the two in step.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace braid {

enum class ConfigType { kString, kInt, kDouble, kEnum };

struct ConfigVar {
  const char* name;           // BRAID_...
  ConfigType type;
  const char* default_value;  // nullptr: unset by default
  const char* choices;        // kEnum: "a|b|c"; otherwise nullptr
  const char* meaning;        // one line for docs/config.md
};

// Every BRAID_* variable braid reads.
std::span<const ConfigVar> config_table();

// Values of the table's variables, from one environment snapshot.
class Config {
 public:
  // The process environment, parsed once on first use. Logs nothing: the log module reads its level from
  // here, so a line logged from inside this first parse would re-enter the log level's initialisation.
  static const Config& get();

  // What the first parse said about unknown BRAID_* names (with close matches); the log module prints them
  // once it knows its level.
  static const std::vector<std::string>& environment_warnings();

  // Parses an explicit environment (tests). Unknown BRAID_* names go to *warnings.
  static Config parse(const std::map<std::string, std::string>& env, std::vector<std::string>* warnings);

  // Typed getters. Throw kInvalidArgument naming the variable when its value does not parse,
  // and kInternal when `name` is not in the table.
  bool is_set(const char* name) const;
  std::optional<std::string> string(const char* name) const;
  std::optional<int64_t> integer(const char* name) const;
  // integer(), and kInvalidArgument naming the variable and the range when the value lies outside [min, max].
  std::optional<int64_t> integer_in(const char* name, int64_t min, int64_t max) const;
  std::optional<double> real(const char* name) const;

 private:
  const ConfigVar& lookup(const char* name) const;
  std::map<std::string, std::string> values_;  // explicitly set table variables only
};

// Close matches among the table's names for an unknown name (edit distance), best first.
std::vector<std::string> close_config_names(const std::string& unknown);

// The longest timeout accepted, in seconds (about 11.6 days): every wait converts it to nanoseconds, and an
// infinite or huge value would overflow there.
constexpr double kMaxTimeoutS = 1e6;
// The shortest timeout accepted, in seconds: a millisecond (a shorter one fails waits that are merely in flight,
// and a denormal like 1e-300 is a typo, not a bound).
constexpr double kMinTimeoutS = 1e-3;
// Timeout for every bounded wait, in seconds (BRAID_TIMEOUT_S, in [kMinTimeoutS, kMaxTimeoutS]; kInvalidArgument
// naming the variable otherwise).
double timeout_seconds();
// `chosen` (an option named `name`) where it is not 0, else BRAID_TIMEOUT_S; kInvalidArgument naming the option
// where it is negative, not a number, below kMinTimeoutS or above kMaxTimeoutS.
double timeout_seconds(double chosen, const char* name);

// BRAID_EAGER_ZERO_COPY=1: registration exposes ranges to the peers and eager all-gathers, reduce-scatters and all-reduces announce their buffers
// (communicators agree on it at init; the NCCL shim registers segments with braid only then).
bool eager_zero_copy_enabled();

}  // namespace braid

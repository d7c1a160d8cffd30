// Processes, as /proc shows them: who is left in a rank's group, and braid-run's zombie children.
#pragma once

#include <sys/types.h>

#include <optional>
#include <vector>

namespace braid::run {

struct ProcessEntry {
  pid_t pid;
  pid_t parent;
  pid_t group;
  char state;  // 'Z' (zombie) or 'X' (dead): gone
};

// Every process of this pid namespace, or nullopt when /proc cannot be read. O(processes on the host); used
// when a leader exits and, rate-limited, while groups are being stopped.
std::optional<std::vector<ProcessEntry>> list_processes();

inline bool is_gone(const ProcessEntry& process) { return process.state == 'Z' || process.state == 'X'; }

}  // namespace braid::run

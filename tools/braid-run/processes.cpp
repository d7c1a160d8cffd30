// Processes, as /proc shows them: each one's pid, parent, process group and state, read from /proc/<pid>/stat.
#include "processes.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "parse_number.hpp"
#include "system.hpp"

namespace braid::run {

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

}  // namespace braid::run

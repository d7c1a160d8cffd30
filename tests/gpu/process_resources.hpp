// What a process holds that a leak would grow: open fds, threads, and the current GPU's free memory.
#pragma once

#include <cuda_runtime_api.h>
#include <dirent.h>

#include <cstddef>
#include <mutex>
#include <stdexcept>
#include <string>

namespace braid::testing {

// Entries of a /proc/self folder (fd, task) but "." and "..". Serialised: ranks may be threads of this process,
// and another thread's directory fd would be counted as well.
inline size_t proc_entries(const char* folder) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  size_t count = 0;
  if (DIR* dir = opendir(folder)) {
    while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
    closedir(dir);
  }
  return count;
}

inline size_t open_fds() { return proc_entries("/proc/self/fd") - 1; }  // not the directory stream's own
inline size_t live_threads() { return proc_entries("/proc/self/task"); }

inline size_t free_device_bytes() {
  size_t free = 0, total = 0;
  const cudaError_t result = cudaMemGetInfo(&free, &total);
  if (result != cudaSuccess) throw std::runtime_error(std::string("cudaMemGetInfo: ") + cudaGetErrorString(result));
  return free;
}

}  // namespace braid::testing

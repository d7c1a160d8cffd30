// Owns a file descriptor until destroyed.
#pragma once

#include <unistd.h>

namespace braid::detail {

struct FdOwner {
  int fd = -1;
  FdOwner() = default;
  explicit FdOwner(int owned) : fd(owned) {}
  FdOwner(const FdOwner&) = delete;
  FdOwner& operator=(const FdOwner&) = delete;
  ~FdOwner() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace braid::detail

// Shared memory among the ranks of one communicator on one host. Rank 0 makes a memfd of the board's size, zeroed
// and sealed at that size, and the fd exchanger passes it to every other rank: the board has no name to leak, only
// the communicator's ranks map it, and no rank can shrink it under another's mapping.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bootstrap/fd_passing.hpp"

namespace braid {

class HostBoard {
 public:
  // Collective over the ranks of `fds`: every rank passes the same `tag` (unused by other exchanges of `fds`) and
  // `bytes`. `name` names the board in errors and in /proc. Throws Error(kSystemError) where memfd_create, ftruncate,
  // fcntl or mmap fail, and Error(kInternal) where the fd received is not a board of `bytes`, sealed.
  HostBoard(FdExchanger& fds, int rank, int size, uint64_t tag, size_t bytes, const char* name);
  ~HostBoard();
  HostBoard(const HostBoard&) = delete;
  HostBoard& operator=(const HostBoard&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace braid

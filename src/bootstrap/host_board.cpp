#include "bootstrap/host_board.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "core/error.hpp"
#include "core/fd_owner.hpp"

namespace braid {
namespace {

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

int made_board(size_t bytes, const char* name) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) raise_system("memfd_create", errno, name);
  detail::FdOwner owned(fd);  // closed if anything below throws
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) raise_system("ftruncate", errno, name);
  if (::fcntl(fd, F_ADD_SEALS, kSeals) != 0) raise_system("fcntl(F_ADD_SEALS)", errno, name);
  owned.fd = -1;
  return fd;
}

// What rank 0 passed: a memfd of `bytes` that nobody can shrink.
void check_received(int fd, size_t bytes, const char* name) {
  struct stat status {};
  if (::fstat(fd, &status) != 0) raise_system("fstat", errno, name);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) raise_system("fcntl(F_GET_SEALS)", errno, name);
  if (static_cast<size_t>(status.st_size) != bytes || (seals & F_SEAL_SHRINK) == 0) {
    raise(ErrorCode::kInternal, "{}: rank 0 passed {} bytes{}, where {} sealed bytes were due", name, status.st_size,
          (seals & F_SEAL_SHRINK) == 0 ? " that can shrink" : "", bytes);
  }
}

}  // namespace

HostBoard::HostBoard(FdExchanger& fds, int rank, int size, uint64_t tag, size_t bytes, const char* name)
    : bytes_(bytes) {
  const int fd = rank == 0 ? made_board(bytes, name) : fds.receive(0, tag);
  const detail::FdOwner owned(fd);  // the mapping keeps the memory
  if (rank == 0) {
    for (int peer = 1; peer < size; ++peer) fds.send(peer, fd, tag);
  } else {
    check_received(fd, bytes, name);
  }
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) raise_system("mmap", errno, name);
  data_ = mapped;
}

HostBoard::~HostBoard() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
}

}  // namespace braid

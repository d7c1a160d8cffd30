// braid-run's small system helpers: errno as an exception and close-on-exec pipes.
#include "system.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace braid::run {

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

void make_pipe(UniqueFd& read_end, UniqueFd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe2");
  read_end = UniqueFd(fds[0]);
  write_end = UniqueFd(fds[1]);
}

}  // namespace braid::run

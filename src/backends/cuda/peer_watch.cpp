#include "backends/cuda/peer_watch.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::detail {
namespace {

int open_pidfd(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

PeerWatch::PeerWatch(MemoryContext& memory, const std::vector<int>& pids, std::function<void(int, int)> on_exit,
                     std::function<void(int)> on_revoke)
    : rank_(memory.rank),
      world_(memory.size),
      // every rank makes its boards in the same order, so the tags agree
      board_memory_(*memory.fds, memory.rank, memory.size, memory.alloc_sequence++,
                    static_cast<size_t>(memory.size + 1) * sizeof(std::atomic<uint32_t>), "braid-peer-board"),
      board_(static_cast<std::atomic<uint32_t>*>(board_memory_.data())),
      on_exit_(std::move(on_exit)),
      on_revoke_(std::move(on_revoke)) {
  const int self = static_cast<int>(::getpid());
  for (int r = 0; r < static_cast<int>(pids.size()); ++r) {
    if (r == rank_ || pids[r] <= 0 || pids[r] == self) continue;
    const int pidfd = open_pidfd(pids[r]);
    if (pidfd < 0 && errno == ESRCH) {  // already gone: a failure unless it left cleanly, as run() judges
      if (board_[r].load(std::memory_order_acquire) == 0) on_exit_(r, pids[r]);
      continue;
    }
    if (pidfd < 0) {
      BRAID_INFO("peer exits are noticed only by the timeout: pidfd_open of rank {} (pid {}) failed: {}", r, pids[r],
                 std::strerror(errno));
      continue;
    }
    ranks_.push_back(r);
    pids_.push_back(pids[r]);
    pidfds_.push_back(pidfd);
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) raise_system("eventfd", errno, "the peer watch");
  thread_ = std::thread([this] { run(); });
}

PeerWatch::~PeerWatch() {
  board_[rank_].store(1, std::memory_order_release);  // before this process can exit: a clean departure
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  for (const int pidfd : pidfds_) {
    if (pidfd >= 0) ::close(pidfd);
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool PeerWatch::revoke() {
  uint32_t none = 0;
  if (!board_[world_].compare_exchange_strong(none, static_cast<uint32_t>(rank_) + 1, std::memory_order_acq_rel)) {
    return false;
  }
  on_revoke_(rank_);  // this rank at once; the others at their next look
  return true;
}

void PeerWatch::run() {
  std::vector<pollfd> polled(pidfds_.size() + 1);
  bool revoked = false;
  for (;;) {
    for (size_t i = 0; i < pidfds_.size(); ++i) polled[i] = {pidfds_[i], POLLIN, 0};
    polled.back() = {wake_fd_, POLLIN, 0};
    const int ready = ::poll(polled.data(), polled.size(), kLookMs);
    if (ready < 0 && errno != EINTR) {
      BRAID_WARN("the peer watch stops: poll failed: {}", std::strerror(errno));
      return;
    }
    if (ready > 0 && polled.back().revents != 0) return;  // the destructor's stop
    for (size_t i = 0; ready > 0 && i < pidfds_.size(); ++i) {
      if (pidfds_[i] < 0 || polled[i].revents == 0) continue;
      ::close(pidfds_[i]);
      pidfds_[i] = -1;  // poll skips negative fds
      if (board_[ranks_[i]].load(std::memory_order_acquire) == 0) on_exit_(ranks_[i], pids_[i]);
    }
    const uint32_t by = board_[world_].load(std::memory_order_acquire);
    if (by != 0 && !revoked) {
      revoked = true;
      if (static_cast<int>(by) - 1 != rank_) on_revoke_(static_cast<int>(by) - 1);
    }
  }
}

}  // namespace braid::detail

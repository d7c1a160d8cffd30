// Passing file descriptors between the processes (or threads) of one host over Unix domain sockets
// (SCM_RIGHTS). Each rank listens on a socket file in a directory only this user may enter (mode 0700), named
// after the communicator's random id (not the job id), so two communicators on one host, of one job or of two,
// never collide, and processes of other users cannot connect.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "braid/error.hpp"
#include "core/interruption.hpp"
#include "core/rate_limit.hpp"

namespace braid {

class FdExchanger {
 public:
  // Listens on "<directory>/braid-fd-<scope>-<rank>". `scope` must be unique per communicator on the host
  // (the communicator's unique id). `directory` empty: default_directory(). Throws Error(kSystemError) naming
  // the socket if it is taken, or naming the directory if it is not a private one (see NOTE [private socket
  // directory] in fd_passing.cpp).
  FdExchanger(std::string scope, int rank, int size, double timeout_s, std::string directory = "");
  ~FdExchanger();
  FdExchanger(const FdExchanger&) = delete;
  FdExchanger& operator=(const FdExchanger&) = delete;

  // Sends a duplicate of `fd` to `peer`, tagged with `tag` (the caller still owns `fd`), waiting at most timeout_s
  // for the peer's listener. Throws Error(kTimeout) naming the peer, or the interruption's error once interrupt()
  // was called.
  void send(int peer, int fd, uint64_t tag);
  // Returns the fd `peer` sent with `tag` (the caller owns it), waiting at most timeout_s.
  // Messages that arrive for other (peer, tag) pairs are kept for later calls.
  // Throws Error(kTimeout) naming the peer and the tag, or the interruption's error once interrupt() was called.
  int receive(int peer, uint64_t tag);
  // Closes every fd received with `tag` and not taken, and every one that arrives with it later: for an exchange
  // the caller gave up on (a failed import), whose peers' fds would otherwise keep their allocations alive.
  void discard(uint64_t tag);
  // Ends every receive() and send() waiting now, and refuses every later one (from any thread), within 20 ms (a
  // send: within its pause between attempts to connect, at most 50 ms): they raise `code` with `reason` (NOTE [ended host waits]),
  // or kAborted for interrupt().
  void interrupt(ErrorCode code, std::string_view reason) noexcept { interrupted_.end(code, reason); }
  void interrupt() noexcept { interrupted_.abort(); }
  // The process id of every rank (0: not known, checked by uid alone), once the ranks have told each other:
  // from then on send() passes fds only to a listener that is the rank's process, and receive() takes fds only
  // from it (others are dropped with a warning). Ranks in another pid namespace are passed as 0: the kernel
  // names their processes differently.
  void admit(std::vector<int> pids);

  // Sends `fd` to every other rank and receives every other rank's fd with the same tag.
  // Result[r] is rank r's fd (caller owns them); result[rank] is -1.
  std::vector<int> all_exchange(int fd, uint64_t tag);

  // Path of a rank's socket file, for messages and tests.
  std::string socket_path(int rank) const;
  const std::string& directory() const { return directory_; }

  // Where every rank of this user on this host puts its socket: $XDG_RUNTIME_DIR/braid when XDG_RUNTIME_DIR is a
  // directory owned by this user, else /tmp/braid-<euid>.
  static std::string default_directory();

 private:
  using Deadline = std::chrono::steady_clock::time_point;
  // Accepts every connection already queued on the listener (never waits for a new one) and
  // stashes its fd in pending_. Caller holds mutex_.
  void accept_pending_connections(Deadline deadline);
  // Reads one message from an accepted connection into pending_; drops malformed ones.
  void stash_message(int connection, Deadline deadline);
  int rank_pid(int rank) const;  // 0 before admit() or where unknown
  void warn(const std::string& message);  // rate-limited (warnings_); caller holds mutex_

  std::string scope_;
  std::string directory_;
  int rank_;
  int size_;
  double timeout_s_;
  int listen_fd_ = -1;
  dev_t socket_device_ = 0;  // the bound socket file, unlinked on close only if it is still this one
  ino_t socket_inode_ = 0;
  Interruption interrupted_;
  std::mutex mutex_;
  std::map<std::pair<int, uint64_t>, int> pending_;  // (peer, tag) -> fd received early
  std::set<uint64_t> discarded_;                     // discard()'s tags: their fds are closed on arrival
  RateLimit warnings_{10, std::chrono::minutes(1)};  // under mutex_
  mutable std::mutex pids_mutex_;
  std::vector<int> pids_;  // admit(); empty: none known
};

}  // namespace braid

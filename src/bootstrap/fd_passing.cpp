// File descriptor passing over Unix sockets (SCM_RIGHTS) whose files lie in a directory private to this user.
//
// Every rank binds "<directory>/braid-fd-<scope>-<rank>" (NOTE [private socket directory]). Every message is one
// short-lived connection: the sender connects to the receiver's listener, sends a 16-byte header with the fd
// attached, and closes. The kernel keeps the connection (and the fd in flight) in the listener's backlog until
// the receiver accepts it, so a send never waits for the receiver to be in receive(): only for its listener to
// exist. Both ends also ask the kernel who is on the other side (SO_PEERCRED): only this uid, and once admit()
// has named them, only the ranks' own processes. A socket file of a rank's name that nobody listens on (a rank
// that died) is removed before bind; an exchanger removes its own file when it closes. Every wait is bounded by
// timeout_s.
//
// NOTE [private socket directory]
// The kernel checks search permission on every directory of a socket's path at connect() and bind(), so socket
// files inside a directory of mode 0700 cannot be reached by another uid (root aside): it cannot fill a rank's
// backlog, pose as a rank, or bind a rank's name first. The directory is $XDG_RUNTIME_DIR/braid when
// XDG_RUNTIME_DIR is a directory owned by this user, else /tmp/braid-<euid>; it is made with mode 0700 when
// missing, and trusted only when it is a real directory (not a symbolic link), owned by geteuid(), with no group
// or other permission bits. Anything else is refused with an error naming the path; a directory this process did
// not make is never chmod-ed. Every rank of a job on a host must resolve the same directory: one uid, one
// XDG_RUNTIME_DIR (or none), one filesystem view. Ranks in different mount namespaces (containers without a
// shared /tmp or XDG_RUNTIME_DIR) cannot pass fds to each other.
#include "bootstrap/fd_passing.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "bootstrap/socket.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "core/rate_limit.hpp"

namespace braid {
namespace {

constexpr uint32_t kMagic = 0x62726664;  // "brfd"
constexpr int kListenBacklog = 256;      // every rank may send to one rank before it accepts any
constexpr int kPollSliceMs = 20;         // receive re-checks fds stashed by other threads this often
constexpr double kMinMessageReadS = 1.0;  // a message's bytes follow its connect at once; allow this much

struct Header {
  uint32_t magic;
  int32_t sender;
  uint64_t tag;
};
static_assert(sizeof(Header) == 16);

void close_quietly(int fd) {
  if (fd >= 0) ::close(fd);
}

// Longest path a socket address holds (sun_path, less its terminating NUL).
constexpr size_t kMaxPathLength = sizeof(sockaddr_un::sun_path) - 1;
constexpr const char* kNamePrefix = "braid-fd-";
constexpr size_t kHashLength = 17;  // "~" and 16 hex digits: what socket_path puts in place of a long scope's tail

// Address of the socket file at `path` (at most kMaxPathLength bytes).
socklen_t path_address(const std::string& path, sockaddr_un* address) {
  std::memset(address, 0, sizeof(*address));
  address->sun_family = AF_UNIX;
  std::memcpy(address->sun_path, path.data(), path.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
}

// Makes `directory` (mode 0700) if it is missing, then refuses it unless it is private to this user (NOTE
// [private socket directory]). Checked through an fd opened without following links, so what is checked is
// what was opened.
void prepare_private_directory(const std::string& directory) {
  const bool made = ::mkdir(directory.c_str(), 0700) == 0;
  if (!made && errno != EEXIST) {
    raise_system("mkdir", errno, fmt::format("making the fd passing socket directory {}", directory));
  }
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP || err == ENOTDIR) {
      raise(ErrorCode::kSystemError,
            "fd passing: socket directory {} is not a directory (a symbolic link or another file); refusing it, "
            "since another user could have made it point anywhere",
            directory);
    }
    raise_system("open", err, fmt::format("checking the fd passing socket directory {}", directory));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int err = errno;
    ::close(fd);
    raise_system("fstat", err, fmt::format("checking the fd passing socket directory {}", directory));
  }
  if (made && (info.st_mode & 07777) != 0700) {  // ours, made just now: the umask may have taken owner bits
    if (::fchmod(fd, 0700) != 0) {
      const int err = errno;
      ::close(fd);
      raise_system("fchmod", err, fmt::format("setting mode 0700 on the fd passing socket directory {}", directory));
    }
    info.st_mode = (info.st_mode & ~07777) | 0700;
  }
  ::close(fd);
  if (info.st_uid != ::geteuid()) {
    raise(ErrorCode::kSystemError,
          "fd passing: socket directory {} is owned by uid {}, not by this process's uid {}; refusing it (another "
          "user may have made it first: remove it, or set XDG_RUNTIME_DIR to a directory of your own)",
          directory, info.st_uid, ::geteuid());
  }
  if ((info.st_mode & 077) != 0) {
    raise(ErrorCode::kSystemError,
          "fd passing: socket directory {} has mode {:04o}: other users may enter it; refusing it (it must have no "
          "group or other permissions, e.g. chmod 0700 {})",
          directory, info.st_mode & 07777, directory);
  }
}


// Waits until `fd` reports `events` or `timeout_ms` passes; false on timeout. EINTR just retries
// the caller's loop (the deadline is absolute).
bool wait_for(int fd, short events, int timeout_ms) {
  pollfd entry{fd, events, 0};
  int ready = ::poll(&entry, 1, timeout_ms);
  if (ready < 0 && errno != EINTR) raise_system("poll", errno, "fd passing");
  return ready > 0;
}

// Connects a non-blocking socket to the socket file at `path`. Returns the socket, or -1 when the peer is not
// there yet (no file: ENOENT; bound but not listening, or a stale file: ECONNREFUSED; backlog full: EAGAIN, then
// *backlog_full is set), so the caller retries. A blocking connect would wait on a full backlog without bound.
int try_connect(const std::string& path, bool* backlog_full) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) raise_system("socket(AF_UNIX)", errno, "fd passing");
  sockaddr_un address;
  socklen_t length = path_address(path, &address);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), length) == 0) return fd;
  int err = errno;
  ::close(fd);
  *backlog_full = err == EAGAIN;
  if (err == ECONNREFUSED || err == EAGAIN || err == ENOENT || err == EINTR) return -1;
  raise_system("connect", err, fmt::format("fd passing to socket {}", path));
}

// Removes the socket file at `path` when no listener is behind it (a rank that died without closing); false
// when it is live (a connection gets through) or is not a socket file of this user, which stays.
bool remove_stale_socket(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return errno == ENOENT;
  if (!S_ISSOCK(info.st_mode) || info.st_uid != ::geteuid()) return false;
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (probe < 0) raise_system("socket(AF_UNIX)", errno, "fd passing");
  sockaddr_un address;
  const socklen_t length = path_address(path, &address);
  const bool refused = ::connect(probe, reinterpret_cast<sockaddr*>(&address), length) != 0 && errno == ECONNREFUSED;
  ::close(probe);  // a live listener sees an empty connection and drops it quietly (stash_message)
  return refused && (::unlink(path.c_str()) == 0 || errno == ENOENT);
}

// Sends the header with `fd` attached (SCM_RIGHTS on the first byte), then any remainder.
// False when the deadline passes first.
bool send_header_with_fd(int socket_fd, const Header& header, int fd, net::Deadline deadline) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  const char* bytes = reinterpret_cast<const char*>(&header);
  size_t sent = 0;
  while (sent < sizeof(header)) {
    iovec io{const_cast<char*>(bytes + sent), sizeof(header) - sent};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    if (sent == 0) {  // the fd rides with the first byte only
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      cmsghdr* cmsg = CMSG_FIRSTHDR(&message);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    }
    ssize_t n = ::sendmsg(socket_fd, &message, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (net::milliseconds_left(deadline) == 0) return false;
      wait_for(socket_fd, POLLOUT, net::milliseconds_left(deadline));
    } else {
      raise_system("sendmsg", errno, "fd passing");
    }
  }
  return true;
}

// One message read from an accepted connection.
struct Message {
  Header header{};
  int fd = -1;
};

enum class ReadResult { kMessage, kEmpty, kMalformed };  // kEmpty: closed before its first byte (a probe)

// Takes the fds out of a received control buffer: the first becomes *fd, any extra are closed
// (a well-formed message carries exactly one).
void take_fds(msghdr* message, int* fd) {
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(message); cmsg != nullptr; cmsg = CMSG_NXTHDR(message, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      if (*fd < 0) {
        *fd = received;
      } else {
        ::close(received);
      }
    }
  }
}

// Reads a header and its fd from `connection`. Anything but kMessage closes any fd received: the peer closed
// before sending a byte (kEmpty), or closed early, sent garbage or let the deadline pass (kMalformed).
ReadResult read_message(int connection, net::Deadline deadline, Message* out) {
  char* bytes = reinterpret_cast<char*>(&out->header);
  size_t received = 0;
  while (received < sizeof(Header)) {
    // Room for a few fds, so a sender that attaches more cannot make the kernel truncate (and drop) ours.
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
    iovec io{bytes + received, sizeof(Header) - received};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(connection, &message, MSG_CMSG_CLOEXEC);
    if (n > 0) {
      take_fds(&message, &out->fd);
      received += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (net::milliseconds_left(deadline) == 0) break;
      wait_for(connection, POLLIN, net::milliseconds_left(deadline));
    } else {
      break;  // closed early or failed
    }
  }
  if (received == sizeof(Header) && out->header.magic == kMagic && out->fd >= 0) return ReadResult::kMessage;
  close_quietly(out->fd);
  out->fd = -1;
  return received == 0 ? ReadResult::kEmpty : ReadResult::kMalformed;
}

// Connects to the socket at `path`, retrying until the deadline or until `interrupted` ends; -1 then, with
// *backlog_full telling whether the last attempt found the listener's backlog full (rather than no listener).
int connect_until(const std::string& path, net::Deadline deadline, const Interruption& interrupted,
                  bool* backlog_full) {
  // The peer may not have bound its listener yet: retry with a short, growing pause.
  int pause_ms = 1;
  while (true) {
    int connection = try_connect(path, backlog_full);
    if (connection >= 0) return connection;
    if (interrupted.ended()) return -1;  // abort, revocation, a peer's exit: not the timeout
    int left_ms = net::milliseconds_left(deadline);
    if (left_ms == 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(pause_ms, left_ms)));
    pause_ms = std::min(pause_ms * 2, 50);
  }
}

// Who is on the other side of `connection`, as the kernel says (for a connection to a listener: the process
// that called listen()); uid -1 when it cannot say. The private directory already keeps other users out; this
// check holds where a socket file was reached some other way (defence in depth), and tells the job's own
// processes apart once admit() names them.
ucred peer_credentials(int connection) {
  ucred credentials{};
  credentials.uid = static_cast<uid_t>(-1);
  socklen_t length = sizeof(credentials);
  if (::getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    credentials.uid = static_cast<uid_t>(-1);
  }
  return credentials;
}

}  // namespace

FdExchanger::FdExchanger(std::string scope, int rank, int size, double timeout_s, std::string directory)
    : scope_(std::move(scope)),
      directory_(directory.empty() ? default_directory() : std::move(directory)),
      rank_(rank),
      size_(size),
      timeout_s_(timeout_s) {
  if (size_ < 1) raise_invalid_argument("FdExchanger", "size", "must be at least 1, got {}", size_);
  if (rank_ < 0 || rank_ >= size_) {
    raise_invalid_argument("FdExchanger", "rank", "must be in [0, {}) (size), got {}", size_, rank_);
  }
  if (!(timeout_s_ > 0)) raise_invalid_argument("FdExchanger", "timeout_s", "must be positive, got {}", timeout_s_);
  // The longest socket path, that of the highest rank with a shortened scope, must fit in sun_path.
  const size_t name_room = 1 + std::strlen(kNamePrefix) + kHashLength + 1 + std::to_string(size_ - 1).size();
  if (directory_.size() + name_room > kMaxPathLength) {
    raise(ErrorCode::kSystemError,
          "fd passing: socket directory {} is too long ({} bytes): a socket path holds at most {} bytes, and "
          "the socket's name needs {} of them (set XDG_RUNTIME_DIR to a shorter path)",
          directory_, directory_.size(), kMaxPathLength, name_room);
  }
  prepare_private_directory(directory_);

  const std::string path = socket_path(rank_);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) raise_system("socket(AF_UNIX)", errno, "fd passing");
  sockaddr_un address;
  socklen_t length = path_address(path, &address);
  int bound = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length);
  if (bound != 0 && errno == EADDRINUSE && remove_stale_socket(path)) {
    bound = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length);
  }
  if (bound != 0) {
    int err = errno;
    close_quietly(listen_fd_);
    if (err == EADDRINUSE) {
      raise(ErrorCode::kSystemError,
            "fd passing: socket {} is already in use: another exchanger with scope '{}' and rank {} exists on "
            "this host (scopes must be unique per communicator), or a file that is not this user's socket has "
            "its name",
            path, scope_, rank_);
    }
    raise_system("bind", err, fmt::format("fd passing on socket {}", path));
  }
  struct stat info {};
  const char* failed = ::listen(listen_fd_, kListenBacklog) != 0 ? "listen"
                       : ::lstat(path.c_str(), &info) != 0   ? "lstat"
                                                             : nullptr;
  if (failed != nullptr) {
    int err = errno;
    close_quietly(listen_fd_);
    ::unlink(path.c_str());
    raise_system(failed, err, fmt::format("fd passing on socket {}", path));
  }
  socket_device_ = info.st_dev;
  socket_inode_ = info.st_ino;
}

FdExchanger::~FdExchanger() {
  // Connections still in the backlog are dropped with the listener; the kernel releases their fds.
  close_quietly(listen_fd_);
  // The socket file goes with it, unless another file has taken its name since.
  const std::string path = socket_path(rank_);
  struct stat info {};
  if (::lstat(path.c_str(), &info) == 0 && info.st_dev == socket_device_ && info.st_ino == socket_inode_) {
    ::unlink(path.c_str());
  }
  for (auto& [key, fd] : pending_) close_quietly(fd);
}

std::string FdExchanger::default_directory() {
  // XDG_RUNTIME_DIR is this user's per-login directory (usually /run/user/<uid>, mode 0700) where it is set.
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  struct stat info {};
  if (runtime != nullptr && runtime[0] == '/' && ::stat(runtime, &info) == 0 && S_ISDIR(info.st_mode) &&
      info.st_uid == ::geteuid()) {
    return std::string(runtime) + "/braid";
  }
  return "/tmp/braid-" + std::to_string(::geteuid());
}

std::string FdExchanger::socket_path(int rank) const {
  const std::string prefix = directory_ + "/" + kNamePrefix;
  const std::string suffix = "-" + std::to_string(rank);
  if (prefix.size() + scope_.size() + suffix.size() <= kMaxPathLength) return prefix + scope_ + suffix;
  // Too long for sun_path: keep a readable prefix of the scope and make it unique with a hash (the constructor
  // checked that the directory leaves room for one).
  const std::string hash = fmt::format("~{:016x}", stable_hash(scope_));
  const size_t fixed = prefix.size() + hash.size() + suffix.size();
  const size_t keep = fixed < kMaxPathLength ? kMaxPathLength - fixed : 0;
  return prefix + scope_.substr(0, keep) + hash + suffix;
}

void FdExchanger::send(int peer, int fd, uint64_t tag) {
  if (peer < 0 || peer >= size_) {
    raise_invalid_argument("FdExchanger::send", "peer", "must be in [0, {}), got {}", size_, peer);
  }
  if (fd < 0) raise_invalid_argument("FdExchanger::send", "fd", "must be an open file descriptor, got {}", fd);

  const auto raise_if_interrupted = [&] {
    if (interrupted_.ended()) interrupted_.raise(fmt::format("fd passing: sending rank {} an fd (tag {})", peer, tag));
  };
  raise_if_interrupted();
  const std::string path = socket_path(peer);
  const net::Deadline deadline = net::deadline_after(timeout_s_);
  bool backlog_full = false;
  int connection = connect_until(path, deadline, interrupted_, &backlog_full);
  if (connection < 0) raise_if_interrupted();
  if (connection < 0 && backlog_full) {
    raise(ErrorCode::kTimeout,
          "fd passing: the backlog of socket {} (rank {}; up to {} connections) stayed full for {} s (a flood of "
          "connections, or a rank that stopped receiving); rank {} sent nothing for tag {}",
          path, peer, kListenBacklog, timeout_s_, rank_, tag);
  }
  if (connection < 0) {
    raise(ErrorCode::kTimeout,
          "fd passing: rank {} is not listening on socket {} after {} s (rank {} sending fd for tag {})", peer,
          path, timeout_s_, rank_, tag);
  }
  // The listener's credentials date from its listen(): one of another user (whose socket file reached the
  // private directory some other way), or once the ranks' processes are known another process than the rank's,
  // gets nothing of this rank's memory.
  const ucred listener = peer_credentials(connection);
  if (listener.uid != ::geteuid()) {
    ::close(connection);
    raise(ErrorCode::kSystemError,
          "fd passing: the listener on socket {} runs as another user than this process; rank {} sent nothing for "
          "tag {} (the socket file of rank {} is not its own)",
          path, rank_, tag, peer);
  }
  const int expected = rank_pid(peer);
  if (expected != 0 && listener.pid != expected) {
    ::close(connection);
    raise(ErrorCode::kSystemError,
          "fd passing: the listener on socket {} is process {}, not rank {}'s process {}; rank {} sent nothing for "
          "tag {} (another process may have bound the rank's socket name first)",
          path, listener.pid, peer, expected, rank_, tag);
  }
  Header header{kMagic, rank_, tag};
  bool sent = false;
  try {
    sent = send_header_with_fd(connection, header, fd, deadline);
  } catch (...) {
    ::close(connection);
    throw;
  }
  ::close(connection);  // the message stays queued for the peer's accept
  if (!sent) {
    raise(ErrorCode::kTimeout, "fd passing: could not send fd for tag {} to rank {} on socket {} within {} s", tag,
          peer, path, timeout_s_);
  }
}

int FdExchanger::receive(int peer, uint64_t tag) {
  if (peer < 0 || peer >= size_) {
    raise_invalid_argument("FdExchanger::receive", "peer", "must be in [0, {}), got {}", size_, peer);
  }
  const net::Deadline deadline = net::deadline_after(timeout_s_);
  const std::pair<int, uint64_t> key{peer, tag};
  while (true) {
    {
      // Holding the lock only while draining the backlog (which never waits for a new connection)
      // lets several threads receive on one exchanger: each sees what the others stashed.
      std::lock_guard<std::mutex> lock(mutex_);
      accept_pending_connections(deadline);
      auto it = pending_.find(key);
      if (it != pending_.end()) {
        int fd = it->second;
        pending_.erase(it);
        return fd;
      }
    }
    if (interrupted_.ended()) {
      interrupted_.raise(fmt::format("fd passing: the wait for rank {}'s fd (tag {})", peer, tag));
    }
    int left_ms = net::milliseconds_left(deadline);
    if (left_ms == 0) {
      raise(ErrorCode::kTimeout,
            "fd passing: rank {} did not send fd for tag {} within {} s (rank {} listening on socket {})", peer,
            tag, timeout_s_, rank_, socket_path(rank_));
    }
    wait_for(listen_fd_, POLLIN, std::min(left_ms, kPollSliceMs));
  }
}

void FdExchanger::discard(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  discarded_.insert(tag);
  try {
    accept_pending_connections(net::deadline_after(0));  // what already came: closed now, not at the next receive
  } catch (const Error&) {
    // a broken listener: what is in pending_ below still closes, and later arrivals cannot come
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->first.second != tag) {
      ++it;
      continue;
    }
    close_quietly(it->second);
    it = pending_.erase(it);
  }
}

void FdExchanger::accept_pending_connections(net::Deadline deadline) {
  while (true) {
    int connection = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      raise_system("accept", errno, fmt::format("fd passing on socket {}", socket_path(rank_)));
    }
    stash_message(connection, std::max(deadline, net::deadline_after(kMinMessageReadS)));
    ::close(connection);
  }
}

// Warnings a stranger on the socket can provoke, at most 10 a minute (the caller holds mutex_).
void FdExchanger::warn(const std::string& message) {
  if (warnings_.allow()) BRAID_WARN("{}{}", message, warnings_.held_back_note());
}

void FdExchanger::stash_message(int connection, net::Deadline deadline) {
  Message message;
  const ucred sender_credentials = peer_credentials(connection);
  if (sender_credentials.uid != ::geteuid()) {
    warn(fmt::format("fd passing: rank {} ignored a connection from another user on socket {}", rank_,
                     socket_path(rank_)));
    return;
  }
  const ReadResult read = read_message(connection, deadline, &message);
  if (read == ReadResult::kEmpty) return;  // a constructor probing whether this socket is live
  if (read == ReadResult::kMalformed) {
    warn(fmt::format("fd passing: rank {} dropped a malformed message on socket {}", rank_, socket_path(rank_)));
    return;
  }
  const int sender = message.header.sender;
  if (sender < 0 || sender >= size_) {
    warn(fmt::format("fd passing: rank {} dropped a message from unknown rank {}", rank_, sender));
    ::close(message.fd);
    return;
  }
  const int expected = rank_pid(sender);
  if (expected != 0 && sender_credentials.pid != expected) {
    warn(fmt::format("fd passing: rank {} dropped a message from process {} posing as rank {} (process {})", rank_,
                     sender_credentials.pid, sender, expected));
    ::close(message.fd);
    return;
  }
  if (discarded_.count(message.header.tag) != 0) {
    close_quietly(message.fd);
    return;
  }
  auto [it, inserted] = pending_.emplace(std::make_pair(sender, message.header.tag), message.fd);
  if (!inserted) {
    // Two fds for one (peer, tag): which is meant is ambiguous; keep the first.
    warn(fmt::format("fd passing: rank {} got a second fd from rank {} for tag {}; dropped it", rank_, sender,
                     message.header.tag));
    ::close(message.fd);
  }
}

void FdExchanger::admit(std::vector<int> pids) {
  if (static_cast<int>(pids.size()) != size_) {
    raise_invalid_argument("FdExchanger::admit", "pids", "has {} entries for {} ranks", pids.size(), size_);
  }
  std::lock_guard<std::mutex> lock(pids_mutex_);
  pids_ = std::move(pids);
}

int FdExchanger::rank_pid(int rank) const {
  std::lock_guard<std::mutex> lock(pids_mutex_);
  return pids_.empty() ? 0 : pids_[rank];
}

std::vector<int> FdExchanger::all_exchange(int fd, uint64_t tag) {
  // Sends first: a send completes once the message is queued at the peer's listener, so no rank
  // waits on another's receive (the backlog holds every rank's message while size <= backlog).
  for (int offset = 1; offset < size_; ++offset) send((rank_ + offset) % size_, fd, tag);
  std::vector<int> fds(size_, -1);
  try {
    for (int offset = 1; offset < size_; ++offset) {
      int peer = (rank_ + size_ - offset) % size_;
      fds[peer] = receive(peer, tag);
    }
  } catch (...) {
    for (int received : fds) close_quietly(received);
    throw;
  }
  return fds;
}

}  // namespace braid

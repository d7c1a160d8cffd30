#include "bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::net {
namespace {

// Longest deadline we represent: far enough to mean "forever", small enough not to overflow the clock.
constexpr double kMaxSeconds = 1e8;

// Pause between connection attempts: short at first (the server is usually about to appear), growing so a
// long wait does not spin.
constexpr auto kFirstRetryPause = std::chrono::milliseconds(10);
constexpr auto kMaxRetryPause = std::chrono::milliseconds(200);

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// Resolves host:port; on failure returns null and puts gai's reason in *error.
AddrInfoList resolve(const std::string& host, int port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    *error = fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc));
    return nullptr;
  }
  return AddrInfoList(result);
}

int local_port(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return -1;
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  return -1;
}

void set_blocking(int fd, bool blocking) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return;
  fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK));
}

// Store messages are small request/reply pairs: Nagle's delay would add tens of ms to each.
void set_no_delay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// A TCP connect to a port on this host with no listener can, by chance, pick the same port as its
// source and connect to itself (simultaneous open). Such a socket would echo our requests as replies.
bool connected_to_itself(int fd) {
  sockaddr_storage mine{}, theirs{};
  socklen_t mine_length = sizeof(mine), theirs_length = sizeof(theirs);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_length) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_length) != 0) return false;
  return mine_length == theirs_length && std::memcmp(&mine, &theirs, mine_length) == 0;
}

// One non-blocking connect to `address`, bounded by the deadline. Returns the connected (blocking) fd,
// or -1 with the reason in *error.
int connect_once(const addrinfo& address, Deadline deadline, std::string* error) {
  const int fd = socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        address.ai_protocol);
  if (fd < 0) {
    *error = fmt::format("socket: {}", std::strerror(errno));
    return -1;
  }
  int err = 0;
  if (connect(fd, address.ai_addr, address.ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd entry{fd, POLLOUT, 0};
      int ready;
      do {
        ready = poll(&entry, 1, milliseconds_left(deadline));
      } while (ready < 0 && errno == EINTR);
      socklen_t length = sizeof(err);
      if (ready <= 0) {
        err = ready == 0 ? ETIMEDOUT : errno;
      } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &length) != 0) {
        err = errno;
      }
    }
  }
  if (err == 0 && connected_to_itself(fd)) err = ECONNREFUSED;
  if (err != 0) {
    *error = fmt::format("connect: {}", std::strerror(err));
    close(fd);
    return -1;
  }
  set_blocking(fd, true);
  set_no_delay(fd);
  return fd;
}

// Waits until `fd` is ready for `events` or the deadline passes. False on timeout or poll error.
bool wait_ready(int fd, short events, Deadline deadline) {
  pollfd entry{fd, events, 0};
  for (;;) {
    const int ready = poll(&entry, 1, milliseconds_left(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

[[noreturn]] void raise_bad_address(const std::string& text, const char* what) {
  raise(ErrorCode::kInvalidArgument, "{}: expected 'host:port' (port 0-65535), got '{}'", what, text);
}

}  // namespace

Deadline deadline_after(double seconds) {
  if (!(seconds > 0)) seconds = 0;  // also maps NaN to 0
  seconds = std::min(seconds, kMaxSeconds);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int milliseconds_left(Deadline deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  // Round up: rounding down would make poll() return early and its callers spin on 0 ms.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

namespace {

// The addresses `host` names for listening, each once (a name may list one address twice).
std::vector<sockaddr_storage> listen_addresses(const std::string& host, int port, const std::string& where) {
  std::string error;
  AddrInfoList addresses = resolve(host, port, /*passive=*/true, &error);
  if (!addresses) raise(ErrorCode::kSystemError, "{} failed: {}", where, error);
  std::vector<sockaddr_storage> unique;
  for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
    sockaddr_storage entry{};
    std::memcpy(&entry, address->ai_addr, std::min<size_t>(address->ai_addrlen, sizeof(entry)));
    const bool seen = std::any_of(unique.begin(), unique.end(), [&](const sockaddr_storage& other) {
      return std::memcmp(&other, &entry, sizeof(entry)) == 0;
    });
    if (!seen) unique.push_back(entry);
  }
  return unique;
}

void set_port(sockaddr_storage* address, int port) {
  if (address->ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(address)->sin_port = htons(port);
  if (address->ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(address)->sin6_port = htons(port);
}

std::string address_text(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(address).sin_addr, text, sizeof(text));
    return text;
  }
  inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(address).sin6_addr, text, sizeof(text));
  return fmt::format("[{}]", text);
}

// Whether a failed socket() or bind() means this host has no such address (IPv6 turned off, say): then nobody
// can listen there, and the address is skipped.
bool address_absent(int err) { return err == EAFNOSUPPORT || err == EADDRNOTAVAIL || err == EPROTONOSUPPORT; }

// One listening socket on `address`; -1 with *err set when the address is absent here, -2 with *err set when it
// is taken, throws otherwise. `v6_only`: an IPv6 socket takes IPv6 only (the name's IPv4 addresses get sockets
// of their own).
int listen_on(const sockaddr_storage& address, bool v6_only, const std::string& where, int* err) {
  const int fd = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    if (address_absent(*err)) return -1;
    raise_system("socket", *err, where);
  }
  // A restarted server must be able to take its port back while old connections sit in TIME_WAIT.
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (address.ss_family == AF_INET6 && v6_only) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  const socklen_t length = address.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 || listen(fd, SOMAXCONN) != 0) {
    *err = errno;
    close(fd);
    if (address_absent(*err)) return -1;
    return -2;
  }
  return fd;
}

}  // namespace

std::vector<int> tcp_listen(const std::string& host, int port, int* bound_port) {
  const std::string where = fmt::format("listening on {}:{}", host.empty() ? "*" : host, port);
  const std::vector<sockaddr_storage> addresses = listen_addresses(host, port, where);
  const bool has_v4 = std::any_of(addresses.begin(), addresses.end(),
                                  [](const sockaddr_storage& address) { return address.ss_family == AF_INET; });
  // With port 0 the first address picks the port and the others take the same; where one of them is taken on
  // that port by another process, pick again (a few times).
  constexpr int kPortPicks = 8;
  for (int pick = 0;; ++pick) {
    std::vector<int> fds;
    int chosen = port;
    int failed_errno = EADDRNOTAVAIL;
    std::string failed_address = host;
    bool taken = false;
    for (sockaddr_storage address : addresses) {
      set_port(&address, chosen);
      int err = 0;
      const int fd = listen_on(address, has_v4, where, &err);
      if (fd == -1) continue;  // no such address on this host
      if (fd < 0) {
        failed_errno = err;
        failed_address = fmt::format("{}:{}", address_text(address), chosen);
        taken = true;
        break;
      }
      fds.push_back(fd);
      if (chosen == 0) chosen = local_port(fd);
    }
    if (!taken && !fds.empty()) {
      if (bound_port != nullptr) *bound_port = chosen;
      return fds;
    }
    for (int fd : fds) close(fd);
    if (taken && port == 0 && failed_errno == EADDRINUSE && pick + 1 < kPortPicks) continue;
    if (taken) {
      raise_system("bind", failed_errno,
                   fmt::format("{} (on {}: every address of the name is taken, so that no other process can hold one "
                               "of them and be dialled instead)", where, failed_address));
    }
    raise_system("bind", failed_errno, where);
  }
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

int tcp_connect(const std::string& host, int port, Deadline deadline) {
  return tcp_connect(host, port, deadline, nullptr);
}

double resolve_timeout_s() {
  const double seconds = *Config::get().real("BRAID_RESOLVE_TIMEOUT_S");
  if (!(seconds >= 0.001 && seconds <= 1e6)) {
    raise(ErrorCode::kInvalidArgument, "environment variable BRAID_RESOLVE_TIMEOUT_S={} must be at least 0.001 and at "
          "most 1e6", seconds);
  }
  return seconds;
}

int tcp_connect(const std::string& host, int port, Deadline deadline, std::string* last_error) {
  return tcp_connect(host, port, deadline, last_error, resolve_timeout_s());
}

int tcp_connect(const std::string& host, int port, Deadline deadline, std::string* last_error,
                double resolve_timeout) {
  std::string error;
  auto pause = std::chrono::duration_cast<Clock::duration>(kFirstRetryPause);
  const Deadline started = Clock::now();
  const Deadline resolve_deadline = std::min(deadline, deadline_after(resolve_timeout));
  bool resolved_once = false;  // a name that resolved once and then not (DNS trouble) keeps the whole deadline
  // At least one attempt, even with a deadline already passed.
  for (;;) {
    if (AddrInfoList addresses = resolve(host, port, /*passive=*/false, &error)) {
      resolved_once = true;
      for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
        const int fd = connect_once(*address, deadline, &error);
        if (fd >= 0) return fd;
      }
    } else if (!resolved_once && Clock::now() >= resolve_deadline) {
      const double tried = std::chrono::duration<double>(Clock::now() - started).count();
      error += fmt::format(" (for {:.3g} s{})", tried,
                           resolve_deadline < deadline ? ", BRAID_RESOLVE_TIMEOUT_S" : ", the connection's timeout");
      break;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    BRAID_TRACE("connect to {}:{} failed ({}); retrying", host, port, error);
    std::this_thread::sleep_for(std::min(pause, deadline - now));
    pause = std::min<Clock::duration>(pause * 2, kMaxRetryPause);
  }
  if (last_error != nullptr) *last_error = error;
  return -1;
}

bool write_all(int fd, const void* data, size_t bytes, Deadline deadline) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!wait_ready(fd, POLLOUT, deadline)) return false;
    // MSG_NOSIGNAL: a peer that went away must give EPIPE here, not kill the process with SIGPIPE.
    const ssize_t sent = send(fd, cursor, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return false;
    }
    cursor += sent;
    bytes -= static_cast<size_t>(sent);
  }
  return true;
}

bool read_all(int fd, void* data, size_t bytes, Deadline deadline) {
  char* cursor = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_ready(fd, POLLIN, deadline)) return false;
    const ssize_t received = recv(fd, cursor, bytes, MSG_DONTWAIT);
    if (received == 0) return false;  // peer closed
    if (received < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return false;
    }
    cursor += received;
    bytes -= static_cast<size_t>(received);
  }
  return true;
}

std::pair<std::string, int> parse_host_port(const std::string& text, const char* what) {
  auto fail = [&]() { raise_bad_address(text, what); };
  std::string host;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {  // "[v6 address]:port"
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') fail();
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) fail();
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  int port = -1;
  const char* end = port_text.data() + port_text.size();
  const auto [stop, ec] = std::from_chars(port_text.data(), end, port);
  if (host.empty() || port_text.empty() || ec != std::errc() || stop != end || port < 0 || port > 65535) {
    fail();
  }
  return {host, port};
}

}  // namespace braid::net

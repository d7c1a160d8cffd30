// The store's server: one thread polls the listeners and every connection, reads requests and sends replies within
// one budget, and drops clients that are slow, unproven or too large. store_requests.cpp answers the requests; the
// wire protocol is store_wire.hpp's.
//
// NOTE [store budget]
// Everything a client can make the server hold counts against one budget (StoreLimits::budget_bytes): stored keys
// and values, request bytes received and not yet handled (a frame's whole length is reserved as soon as its header
// is in, and no more is read than the budget has room for), replies not yet sent, and parked keys. A request that
// would take the server past it first drops the clients that hold more than its own would with it and at least
// 1/kStoreDroppableShare of the budget, the largest first (make_room_for: what they hold goes with them, stored
// entries stay); what still does not fit is refused, naming the limit. An allocation that fails anyway drops that
// client.
#include "bootstrap/store.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/store_server_impl.hpp"
#include "bootstrap/store_wire.hpp"
#include "bootstrap/tcp_peer.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/rate_limit.hpp"

namespace braid {

using namespace store_server;
using namespace store_wire;

namespace {

// Raises the soft limit on descriptors to the hard one (once a process): every rank holds a connection, and idle
// strangers must not exhaust the descriptors before the unproven-connection bound closes them.
void raise_descriptor_limit() {
  static std::once_flag raised;
  std::call_once(raised, [] {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
    const rlim_t wanted = limit.rlim_max == RLIM_INFINITY ? rlim_t(1) << 20 : limit.rlim_max;
    if (limit.rlim_cur >= wanted) return;  // never lowered (an unlimited hard limit caps the raise at 2^20)
    limit.rlim_cur = wanted;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      BRAID_DEBUG("cannot raise the descriptor limit to {}: {}", limit.rlim_cur, std::strerror(errno));
    }
  });
}

// The live connection whose `footprint` is largest (the client to drop when memory runs short); null when none.
template <typename Footprint>
Connection* holding_most(const std::vector<std::unique_ptr<Connection>>& connections, Footprint footprint) {
  Connection* largest = nullptr;
  for (const auto& connection : connections) {
    if (!connection->dead && (largest == nullptr || footprint(*connection) > footprint(*largest))) {
      largest = connection.get();
    }
  }
  return largest;
}

}  // namespace

StoreServer::Impl::Impl(const std::string& host, int requested_port, StoreLimits store_limits, std::string job_secret)
    : limits(store_limits), secret(std::move(job_secret)) {
  if (limits.budget_bytes == 0) {
    limits.budget_bytes = static_cast<size_t>(
        *Config::get().integer_in("BRAID_STORE_BUDGET_BYTES", int64_t(1) << 20, int64_t(1) << 40));
  }
  if (limits.max_value_bytes == 0) {
    limits.max_value_bytes = static_cast<size_t>(
        *Config::get().integer_in("BRAID_STORE_MAX_VALUE_BYTES", 1, int64_t(1) << 32));
  }
  raise_descriptor_limit();
  listen_fds = net::tcp_listen(host, requested_port, &port);
  address = fmt::format("{}:{}", host.empty() ? "*" : host, port);
  if (secret.empty() && !net::is_loopback_host(host)) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      BRAID_WARN("store server {} listens beyond loopback and serves any client that reaches it: set "
                 "BRAID_JOB_SECRET, the same in every process of the job (braid-run sets one), so that only the "
                 "job's processes can use it", address);
    });
  }
  // Non-blocking, so accept_clients() can drain the backlog and stop at EAGAIN.
  for (int fd : listen_fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int err = errno;
    for (int fd : listen_fds) close(fd);
    raise_system("eventfd", err, "starting the store server at " + address);
  }
  thread = std::thread([this] { run(); });
  BRAID_DEBUG("store server listening on {}", address);
}

StoreServer::Impl::~Impl() {
  const uint64_t one = 1;
  if (write(wake_fd, &one, sizeof(one)) != static_cast<ssize_t>(sizeof(one))) {
    BRAID_ERROR("store server {}: cannot signal its thread to stop: {}", address, std::strerror(errno));
  }
  thread.join();
  for (auto& connection : connections) close(connection->fd);
  for (int fd : listen_fds) close(fd);
  close(wake_fd);
  BRAID_DEBUG("store server {} stopped", address);
}

// The thread's body: serve until told to stop. An unexpected failure stops serving (clients then see
// their connections close) rather than terminating the process.
void StoreServer::Impl::run() {
  try {
    serve();
  } catch (const std::exception& error) {
    BRAID_ERROR("store server {} stopped serving: {}", address, error.what());
  } catch (...) {
    BRAID_ERROR("store server {} stopped serving: an unknown exception", address);
  }
  // Clients see their connections close, and new ones are refused at once, rather than waiting on a listener
  // nobody serves until their timeout.
  for (auto& connection : connections) connection->dead = true;
  drop_dead_connections();
  for (int fd : listen_fds) close(fd);
  listen_fds.clear();
}

void StoreServer::Impl::serve() {
  std::vector<pollfd> fds;
  for (;;) {
    try {
      if (!serve_round(fds)) return;
    } catch (const std::bad_alloc&) {
      // Out of memory where no one client's request was at fault (or while dropping one): shed the client holding
      // the most memory and go on; with none to shed, stop serving (run() reports it).
      if (!shed_largest_client()) throw;
    }
  }
}

// Marks the client holding the most memory dead and drops it; false when there is none.
bool StoreServer::Impl::shed_largest_client() {
  Connection* largest = holding_most(connections, [](const Connection& connection) {
    return connection.input.capacity() + connection.output.capacity() + connection.parked_bytes;
  });
  if (largest == nullptr) return false;
  largest->dead = true;
  drop_dead_connections();
  try {
    warn("dropped the client holding the most memory: the store ran out of memory");
  } catch (const std::bad_alloc&) {
  }
  return true;
}

// One round: wait for events, accept, read, handle, write, drop. False once the server is told to stop.
bool StoreServer::Impl::serve_round(std::vector<pollfd>& fds) {
  fds.clear();
  fds.push_back({wake_fd, POLLIN, 0});
  const bool accepting = net::Clock::now() >= accept_resumes;
  for (int fd : listen_fds) fds.push_back({accepting ? fd : -1, POLLIN, 0});  // poll skips a negative fd
  for (const auto& connection : connections) {
    const bool has_output = connection->output_sent < connection->output.size();
    // POLLHUP and POLLERR still come
    const short reading = connection->backed_up() || connection->closing ? 0 : POLLIN;
    fds.push_back({connection->fd, static_cast<short>(reading | (has_output ? POLLOUT : 0)), 0});
  }
  const int ready = poll(fds.data(), fds.size(), next_wakeup_ms());
  if (ready < 0) {
    if (errno == EINTR) return true;
    raise_system("poll", errno, "serving the store at " + address);
  }
  if (fds[0].revents != 0) return false;  // shutdown
  // Connections accepted below are appended after the ones polled, so indices stay aligned.
  const size_t first = 1 + listen_fds.size();
  const size_t polled = fds.size() - first;
  for (size_t i = 0; i < listen_fds.size(); ++i) {
    if (fds[1 + i].revents & POLLIN) accept_clients(listen_fds[i]);
  }
  starved = false;
  size_t room = limits.budget_bytes - std::min(limits.budget_bytes, bytes_in_use());
  for (size_t i = 0; i < polled; ++i) {
    const short events = fds[first + i].revents;
    if (events & POLLOUT) flush(*connections[i]);
    if (events & (POLLIN | POLLHUP | POLLERR)) receive(*connections[i], &room);
  }
  handle_pending_work();
  if (starved) make_room();
  drop_slow_clients(net::Clock::now());
  drop_dead_connections();
  return true;
}

// poll() timeout: until the earliest parked deadline, slow-client deadline or the listener's rest, or forever
// when there is none.
int StoreServer::Impl::next_wakeup_ms() const {
  int timeout = -1;
  const auto consider = [&timeout](net::Deadline deadline) {
    const int left = net::milliseconds_left(deadline);
    timeout = timeout < 0 ? left : std::min(timeout, left);
  };
  for (const auto& connection : connections) {
    if (connection->dead) continue;
    if (connection->parked) consider(connection->parked->deadline);
    const auto limit =
        std::chrono::duration_cast<net::Clock::duration>(std::chrono::duration<double>(limits.slow_client_s));
    if (connection->frame_started) consider(*connection->frame_started + limit);
    if (!connection->proven) {
      consider(connection->accepted + std::chrono::duration_cast<net::Clock::duration>(
                                          std::chrono::duration<double>(limits.prove_within_s)));
    }
  }
  if (net::Clock::now() < accept_resumes) consider(accept_resumes);
  return timeout;
}

// Warnings a client can provoke go through `warnings` (kWarningsPerMinute).
void StoreServer::Impl::warn(const std::string& message) {
  if (warnings.allow()) BRAID_WARN("store server {}: {}{}", address, message, warnings.held_back_note());
}

void StoreServer::Impl::drop_client(Connection& connection, const std::string& why) {
  connection.dead = true;
  warn("dropping a client: " + why);
}

// A client that begins a request frame and does not finish it within limits.slow_client_s is dropped (a
// connection that trickles bytes would otherwise hold its buffer forever), and so is one that has not proved
// the job secret limits.prove_within_s after it connected (idle strangers would otherwise hold descriptors).
// Only frames the server would parse now count: those behind a parked request or unread replies wait for the
// server, not for the client.
void StoreServer::Impl::track_unfinished_frame(Connection& connection, net::Clock::time_point now) {
  const bool waits_for_client = !connection.dead && !connection.parked && !connection.backed_up() &&
                                connection.unparsed() > 0;
  if (!waits_for_client) {
    connection.frame_started.reset();
  } else if (!connection.frame_started) {
    connection.frame_started = now;
  }
}

void StoreServer::Impl::drop_slow_clients(net::Clock::time_point now) {
  const auto limit = std::chrono::duration<double>(limits.slow_client_s);
  for (auto& connection : connections) {
    track_unfinished_frame(*connection, now);
    if (connection->frame_started && now - *connection->frame_started >= limit) {
      drop_client(*connection, fmt::format("a request frame stayed unfinished for {} s", limits.slow_client_s));
    } else if (!connection->dead && !connection->proven &&
               now - connection->accepted >= std::chrono::duration<double>(limits.prove_within_s)) {
      drop_client(*connection,
                  fmt::format("it did not prove it knows the job secret within {} s", limits.prove_within_s));
    }
  }
}

size_t StoreServer::Impl::bytes_in_use() const {
  size_t total = stored_bytes;
  for (const auto& connection : connections) {
    if (!connection->dead) total += connection->held_bytes();
  }
  return total;
}

// A connection was left unread for want of budget: drop the client holding the most of it, unless what it holds
// is on its way out (replies being sent, refusals closing), so that the job's own small requests go on.
void StoreServer::Impl::make_room() {
  Connection* largest = holding_most(connections, [](const Connection& connection) {
    return connection.closing ? 0 : connection.held_bytes();
  });
  if (largest == nullptr || largest->closing || bytes_in_use() < limits.budget_bytes / 2) return;
  drop_client(*largest, fmt::format("the {} bytes it holds took the store to its budget of {} bytes "
                                    "(BRAID_STORE_BUDGET_BYTES)", largest->held_bytes(), limits.budget_bytes));
}

// Whether `more` bytes fit the budget, once the clients holding more than `requester` would with them, and at
// least kStoreDroppableShare of the budget, are dropped, the largest first (their unread replies, unfinished frames
// and parked keys; stored entries stay), so that a client that floods the store loses to the job's small requests
// instead of starving them, while a rank's few waiting keys are never dropped for another's request. No client is
// dropped where dropping them all would not make the room.
bool StoreServer::Impl::make_room_for(Connection& requester, size_t more) {
  if (fits(more)) return true;
  const size_t least = std::max(requester.held_bytes() + more + 1, limits.budget_bytes / kStoreDroppableShare);
  std::vector<Connection*> larger;
  size_t freeable = 0;
  for (const auto& connection : connections) {
    if (connection->dead || connection->closing || connection.get() == &requester) continue;
    if (connection->held_bytes() < least) continue;
    larger.push_back(connection.get());
    freeable += connection->held_bytes();
  }
  if (bytes_in_use() - freeable + more > limits.budget_bytes) return false;
  std::sort(larger.begin(), larger.end(),
            [](const Connection* x, const Connection* y) { return x->held_bytes() > y->held_bytes(); });
  for (Connection* connection : larger) {
    if (fits(more)) break;
    drop_client(*connection, fmt::format("the {} bytes it holds took the store to its budget of {} bytes "
                                         "(BRAID_STORE_BUDGET_BYTES), where another client's request of {} bytes "
                                         "needed room", connection->held_bytes(), limits.budget_bytes, more));
  }
  return fits(more);
}

void StoreServer::Impl::refuse_over_budget(Connection& connection, const std::string& what, size_t bytes) {
  refuse(connection,
         fmt::format("{} needs {} bytes that the store's budget of {} bytes (BRAID_STORE_BUDGET_BYTES) does not have "
                     "now ({} in use)", what, bytes, limits.budget_bytes, bytes_in_use()),
         fmt::format("{} of {} bytes does not fit the budget", what, bytes));
}

// With a job secret, unproven connections are few: beyond limits.max_unproven_connections the oldest is closed.
void StoreServer::Impl::admit_unproven(Connection& newest) {
  size_t unproven = 0;
  Connection* oldest = nullptr;
  for (auto& connection : connections) {
    if (connection->dead || connection->proven || connection.get() == &newest) continue;
    ++unproven;
    if (oldest == nullptr || connection->accepted < oldest->accepted) oldest = connection.get();
  }
  if (unproven >= limits.max_unproven_connections && oldest != nullptr) {
    drop_client(*oldest, fmt::format("{} connections had not proved the job secret yet; this was the oldest",
                                     unproven + 1));
  }
}

void StoreServer::Impl::accept_clients(int listen_fd) {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        accept_resumes = net::Clock::now() + kAcceptBackoff;
      }
      warn(fmt::format("accept failed: {}", std::strerror(err)));
      return;
    }
    // A client of this host is served only when the kernel attributes its socket to this process's user; one it
    // cannot attribute is refused too (fail closed). Clients of other hosts: only the job secret tells.
    const net::PeerOwner owner = net::peer_owner(fd);
    if (!net::serves_peer(owner, ::geteuid())) {
      close(fd);
      warn(owner.uid ? fmt::format("refused a connection of this host's uid {}: the store serves uid {} only",
                                   *owner.uid, ::geteuid())
                     : fmt::format("refused a connection of this host whose owner the kernel did not name ({}): the "
                                   "store serves uid {} only", owner.unknown_why, ::geteuid()));
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    connection->proven = secret.empty();
    connection->accepted = net::Clock::now();
    connections.push_back(std::move(connection));
    if (!secret.empty()) admit_unproven(*connections.back());
  }
}

// Reads what the client sent, within the budget's `room` (a frame whose length was reserved reads into its
// reservation); a connection left unread for want of room marks the round starved.
void StoreServer::Impl::receive(Connection& connection, size_t* room) {
  char buffer[64 * 1024];
  size_t total = 0;
  const size_t per_round = connection.proven ? kMaxReadPerRound : kMaxUnprovenReadPerRound;
  try {
    while (!connection.dead && !connection.closing && total < per_round) {
      const size_t reserved = connection.frame_reserved > connection.unparsed()
                                  ? connection.frame_reserved - connection.unparsed() : 0;
      const size_t allowed = std::min({sizeof(buffer), per_round - total, reserved + *room});
      if (allowed == 0) {
        starved = true;
        return;
      }
      const ssize_t received = recv(connection.fd, buffer, allowed, MSG_DONTWAIT);
      if (received > 0) {
        connection.input.append(buffer, static_cast<size_t>(received));
        total += static_cast<size_t>(received);
        const size_t beyond = static_cast<size_t>(received) > reserved ? static_cast<size_t>(received) - reserved : 0;
        *room -= std::min(*room, beyond);
      } else if (received == 0) {
        connection.dead = true;  // the client went away (possibly mid-wait: its parked request goes too)
      } else if (errno == EINTR) {
        continue;
      } else {
        if (errno != EAGAIN && errno != EWOULDBLOCK) connection.dead = true;
        return;
      }
    }
  } catch (const std::bad_alloc&) {
    drop_client(connection, "the store ran out of memory receiving its request");
  }
}

// Handles every complete request and every parked request that can now be answered. Handling one
// connection's SET can release another's GET, whose connection may then have more requests buffered,
// so repeat until nothing moves.
void StoreServer::Impl::handle_pending_work() {
  bool progress = true;
  while (progress) {
    progress = false;
    for (auto& connection : connections) progress |= handle_buffered_requests(*connection);
    progress |= release_parked();
  }
  for (auto& connection : connections) flush(*connection);
}

void StoreServer::Impl::flush(Connection& connection) {
  while (!connection.dead && connection.output_sent < connection.output.size()) {
    const ssize_t sent = send(connection.fd, connection.output.data() + connection.output_sent,
                              connection.output.size() - connection.output_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent >= 0) {
      connection.output_sent += static_cast<size_t>(sent);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;  // poll() tells us when the client reads
    } else if (errno != EINTR) {
      connection.dead = true;
    }
  }
  connection.output.clear();
  connection.output_sent = 0;
  if (connection.output.capacity() > kShrinkAboveBytes) connection.output.shrink_to_fit();
  if (connection.closing) connection.dead = true;  // its last reply is out
}

void StoreServer::Impl::drop_dead_connections() {
  std::erase_if(connections, [](const std::unique_ptr<Connection>& connection) {
    if (!connection->dead) return false;
    close(connection->fd);
    return true;
  });
}

StoreServer::StoreServer(const std::string& bind_host, int port, StoreLimits limits, std::optional<std::string> secret)
    : impl_(std::make_unique<Impl>(bind_host, port, limits, secret ? std::move(*secret) : job_secret())) {}

StoreServer::~StoreServer() = default;

int StoreServer::port() const { return impl_->port; }

}  // namespace braid

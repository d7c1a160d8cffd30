// The store's server and client, and braid::StoreHost.
//
// Wire protocol (TCP, one request then one reply at a time per connection):
//   frame   := u32 body_length, body                     (integers little-endian)
//   string  := u32 length, bytes                          (binary-safe)
//   request := u8 op, fields
//     SET     key:string value:string              -> OK
//     GET     key:string timeout_ms:i64            -> OK value:string | TIMEOUT
//     TRY_GET key:string                           -> OK value:string | NOT_FOUND
//     WAIT    count:u32 key:string* timeout_ms:i64 -> OK count:u32 missing_key:string*   (count <= 65536)
//     ADD     key:string delta:i64                 -> OK new_value:i64 | ERROR message:string
//     DELETE  key:string                           -> OK | NOT_FOUND
//     HELLO   client_nonce:string                  -> OK server_nonce:string server_proof:string
//     PROVE   client_proof:string                  -> OK
//   reply   := u8 status, fields
//   Any request may be answered REFUSED message:string, after which the server closes the connection.
// A server with a job secret (bootstrap/job_secret.hpp) takes HELLO, then PROVE, then anything else from a
// connection; before PROVE succeeded it refuses every other request and every frame over 256 bytes. After PROVE's
// reply, every frame both ways ends in a 32-byte MAC (store_frame_mac: the connection's session key, the direction
// and the frame's sequence number), which the receiver checks and strips: a frame altered, dropped, replayed,
// reflected or injected by anyone between the ends (a relay that passed the handshake through) ends the
// connection. Whatever the secret, a client of this host is served only when the kernel says its socket is the
// store's own uid's, and closed at once otherwise, also when the kernel cannot say (bootstrap/tcp_peer.hpp).
//
// NOTE [store budget]
// Everything a client can make the server hold counts against one budget (StoreLimits::budget_bytes): stored keys
// and values, request bytes received and not yet handled (a frame's whole length is reserved as soon as its header
// is in, and no more is read than the budget has room for), replies not yet sent, and parked keys. A request that
// would take the server past it first drops the clients that hold more than its own would with it and at least
// 1/kStoreDroppableShare of the budget, the largest first (make_room_for: what they hold goes with them, stored
// entries stay); what still does not fit is refused, naming the limit. An allocation that fails anyway drops that
// client.
// GET and WAIT are parked in the server until their keys exist or their timeout passes, so a client
// never polls. ADD keeps the counter as decimal text, so GET returns it as such.
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
#include <charconv>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/tcp_peer.hpp"
#include "braid/rendezvous.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/rate_limit.hpp"

namespace braid {
namespace {

enum class Op : uint8_t { kSet = 1, kGet = 2, kTryGet = 3, kWait = 4, kAdd = 5, kDelete = 6, kHello = 7, kProve = 8 };
enum class Status : uint8_t { kOk = 0, kNotFound = 1, kTimeout = 2, kError = 3, kRefused = 4 };

// Largest frame a client accepts: a bound on what a confused or hostile server can make it allocate. The server's
// bound is smaller (max_request_frame_bytes).
constexpr uint32_t kMaxFrameBytes = 1u << 30;
// Room a request frame has beyond its value, for its key and fields: a SET of the largest value fits.
constexpr size_t kRequestFrameOverhead = kStoreMaxKeyBytes + 64 + kStoreFrameMacBytes;
// Request frames that carry no value (a WAIT for many keys) may still be this long.
constexpr size_t kMinRequestFrameBytes = size_t(4) << 20;
// Largest frame a connection may send before it proved it knows the job secret (HELLO and PROVE are ~40 bytes).
constexpr uint32_t kMaxUnprovenFrameBytes = 256;
// A blocking GET/WAIT's reply is due when the server-side timeout passes; the client waits this much
// longer before it calls the server unresponsive.
constexpr double kWaitReplyMarginS = 2.0;
// Requests that never wait server-side still get at least this long (a busy server is not a dead one).
constexpr double kMinRequestTimeoutS = 1.0;
// Bytes read from one client per poll round, so one large sender cannot starve the others; less from one that has
// not proved the job secret (its frames are at most kMaxUnprovenFrameBytes).
constexpr size_t kMaxReadPerRound = 4u << 20;
constexpr size_t kMaxUnprovenReadPerRound = 4096;
// Replies a client may leave unread before the server stops taking its requests (until it reads): a client
// that sends requests and never reads the replies cannot make the server buffer without bound.
constexpr size_t kMaxUnsentReplyBytes = 16u << 20;
// After accept() ran out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), the listener rests this
// long: the pending connection stays queued, and polling it again at once would spin.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
// A connection's buffers larger than this are given back once they are mostly empty.
constexpr size_t kShrinkAboveBytes = size_t(1) << 20;
// Warnings a client can provoke: at most this many a minute.
constexpr int kWarningsPerMinute = 10;

// Builds one frame: reserve the length prefix, append fields, patch the length in finish().
class Encoder {
 public:
  Encoder() : frame_(4, '\0') {}
  Encoder& u8(uint8_t value) {
    frame_.push_back(static_cast<char>(value));
    return *this;
  }
  Encoder& u32(uint32_t value) { return little_endian(value, 4); }
  Encoder& i64(int64_t value) { return little_endian(static_cast<uint64_t>(value), 8); }
  Encoder& bytes(std::string_view value) {
    if (value.size() > kMaxFrameBytes) raise_too_large(value.size());
    u32(static_cast<uint32_t>(value.size()));
    frame_.append(value);
    return *this;
  }
  // The frame, length prefix patched in; the encoder is spent afterwards.
  std::string finish() {
    const size_t body = frame_.size() - 4;
    if (body > kMaxFrameBytes) raise_too_large(body);
    for (int i = 0; i < 4; ++i) frame_[i] = static_cast<char>((body >> (8 * i)) & 0xff);
    return std::move(frame_);
  }

 private:
  Encoder& little_endian(uint64_t value, int width) {
    for (int i = 0; i < width; ++i) frame_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
    return *this;
  }
  [[noreturn]] static void raise_too_large(size_t bytes) {
    raise(ErrorCode::kInvalidArgument, "store message of {} bytes exceeds the limit of {} bytes", bytes,
          kMaxFrameBytes);
  }
  std::string frame_;
};

uint64_t read_little_endian(const char* data, int width) {
  uint64_t value = 0;
  for (int i = 0; i < width; ++i) value |= uint64_t(static_cast<unsigned char>(data[i])) << (8 * i);
  return value;
}

// Reads the fields of one frame body; a truncated or over-long body throws kRemoteError naming `context`.
class Decoder {
 public:
  Decoder(std::string_view body, std::string_view context) : body_(body), context_(context) {}
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint32_t u32() { return static_cast<uint32_t>(read_little_endian(take(4), 4)); }
  int64_t i64() { return static_cast<int64_t>(read_little_endian(take(8), 8)); }
  std::string bytes() { return std::string(view()); }
  // A field's bytes where they lie in the body (valid while the body is).
  std::string_view view() {
    const uint32_t length = u32();
    return std::string_view(take(length), length);
  }
  void expect_end() const {
    if (position_ != body_.size()) malformed("trailing bytes");
  }

 private:
  const char* take(size_t count) {
    if (body_.size() - position_ < count) malformed("truncated field");
    const char* data = body_.data() + position_;
    position_ += count;
    return data;
  }
  [[noreturn]] void malformed(const char* problem) const {
    raise(ErrorCode::kRemoteError, "{}: malformed store message ({})", context_, problem);
  }
  std::string_view body_;
  std::string_view context_;
  size_t position_ = 0;
};

int64_t timeout_to_ms(double seconds) {
  if (!(seconds > 0)) return 0;
  return static_cast<int64_t>(std::ceil(std::min(seconds, 1e9) * 1000.0));
}

// ---------------------------------------------------------------------------------------------------
// Server side

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

// A GET or WAIT waiting for keys. While a connection has one, its further requests stay buffered, so
// replies keep the order of requests.
struct Parked {
  Op op;
  std::vector<std::string> keys;
  net::Deadline deadline;
};

struct Connection {
  int fd = -1;
  size_t frame_reserved = 0;  // the length of the frame whose header is in and whose body is not, from the budget
  size_t parked_bytes = 0;    // what the parked request's keys cost the budget
  std::string input;       // bytes received; those from input_used on are not yet handled
  size_t input_used = 0;   // prefix of `input` already handled (dropped in bulk, so parsing stays linear)
  std::string output;      // replies not yet sent
  size_t output_sent = 0;  // prefix of `output` already sent
  std::optional<Parked> parked;
  std::optional<net::Clock::time_point> frame_started;  // since when an unfinished request frame waits
  net::Clock::time_point accepted;  // a connection that has to prove the job secret has slow_client_s for it
  bool dead = false;  // closed by the peer, failed, or sent garbage: dropped at the end of the round
  bool closing = false;  // refused: its last reply is being sent, then it is dropped; no more requests are read
  bool proven = false;   // it proved it knows the job secret (from the start where the server has none)
  std::string client_nonce, server_nonce;  // the HELLO of a server with a secret
  std::string session_key;  // set once the connection proved the secret: every frame after carries a MAC
  uint64_t requests_seen = 0, replies_sent = 0;  // the MACs' sequence numbers

  size_t unparsed() const { return input.size() - input_used; }
  // What the connection costs the budget (NOTE [store budget]).
  size_t held_bytes() const { return std::max(unparsed(), frame_reserved) + unsent() + parked_bytes; }
  size_t unsent() const { return output.size() - output_sent; }
  // Replies pile up unread: take no more requests (nor read them) until the client reads.
  bool backed_up() const { return unsent() > kMaxUnsentReplyBytes; }
};

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

struct StoreServer::Impl {
  Impl(const std::string& host, int requested_port, StoreLimits limits, std::string job_secret);
  ~Impl();

  void run();
  void serve();
  bool serve_round(std::vector<pollfd>& fds);
  bool shed_largest_client();
  int next_wakeup_ms() const;
  void accept_clients(int listen_fd);
  void receive(Connection& connection, size_t* room);
  size_t bytes_in_use() const;
  bool fits(size_t more) const { return bytes_in_use() + more <= limits.budget_bytes; }
  void refuse_over_budget(Connection& connection, const std::string& what, size_t bytes);
  size_t max_request_frame_bytes() const {
    return std::max(limits.max_value_bytes, kMinRequestFrameBytes) + kRequestFrameOverhead;
  }
  void store(std::string key, std::string value);
  bool erase(const std::string& key);
  void admit_unproven(Connection& connection);
  void handle_pending_work();
  bool handle_buffered_requests(Connection& connection);
  std::optional<std::string_view> next_frame(Connection& connection);
  void handle_request(Connection& connection, std::string_view body);
  void handle_handshake(Connection& connection, Op op, Decoder& in);
  void refuse(Connection& connection, const std::string& message, const std::string& why);
  void reply(Connection& connection, Encoder& encoder);
  bool release_parked();
  bool try_answer(Connection& connection, net::Clock::time_point now);
  void add(Connection& connection, const std::string& key, int64_t delta);
  void park(Connection& connection, Parked parked);
  bool key_allowed(Connection& connection, const std::string& key);
  static size_t entry_cost(const std::string& key, const std::string& value);
  void flush(Connection& connection);
  void drop_dead_connections();
  void track_unfinished_frame(Connection& connection, net::Clock::time_point now);
  void drop_slow_clients(net::Clock::time_point now);
  void make_room();
  bool make_room_for(Connection& requester, size_t more);
  void drop_client(Connection& connection, const std::string& why);
  void warn(const std::string& message);

  StoreLimits limits;
  std::string secret;  // the job secret clients prove they know; empty: none (every client is served)
  RateLimit warnings{kWarningsPerMinute, std::chrono::minutes(1)};
  net::Clock::time_point accept_resumes{};  // the listeners rest until then (kAcceptBackoff)
  std::string address;  // "host:port", for logs
  std::vector<int> listen_fds;  // one for each address of the bind host
  int wake_fd = -1;  // eventfd: the destructor writes it to stop the thread
  int port = 0;
  std::unordered_map<std::string, std::string> data;
  size_t stored_bytes = 0;  // what `data` costs the budget
  bool starved = false;     // a connection was left unread this round for want of budget
  std::vector<std::unique_ptr<Connection>> connections;
  std::thread thread;
};

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

// A frame is handled where it lies in the input buffer and consumed afterwards, so that while a request is
// handled its bytes still count against the budget beside what it makes (a SET's value, a WAIT's keys).
bool StoreServer::Impl::handle_buffered_requests(Connection& connection) {
  bool handled = false;
  while (!connection.dead && !connection.closing && !connection.parked && !connection.backed_up()) {
    const std::optional<std::string_view> body = next_frame(connection);
    if (!body) break;
    try {
      handle_request(connection, *body);
    } catch (const Error& error) {  // malformed request: this client is confused; drop it
      drop_client(connection, error.what());
    } catch (const std::bad_alloc&) {
      drop_client(connection, "the store ran out of memory serving its request");
    }
    connection.input_used += 4 + body->size();
    connection.frame_reserved = 0;
    handled = true;
  }
  return handled;
}

namespace {

// Drops what was handled once it is most of the buffer (each byte moves O(1) times in all), and gives back the
// memory of a large frame once it is handled.
void compact_input(Connection& connection) {
  if (connection.input_used > 0 && connection.input_used * 2 >= connection.input.size()) {
    connection.input.erase(0, connection.input_used);
    connection.input_used = 0;
  }
  if (connection.frame_reserved == 0 && connection.input.capacity() > kShrinkAboveBytes &&
      connection.input.capacity() > 2 * connection.input.size()) {
    connection.input.shrink_to_fit();
  }
}

}  // namespace

std::optional<std::string_view> StoreServer::Impl::next_frame(Connection& connection) {
  compact_input(connection);
  const size_t available = connection.unparsed();
  if (available < 4) return std::nullopt;
  const uint64_t length = read_little_endian(connection.input.data() + connection.input_used, 4);
  if (!connection.proven && length > kMaxUnprovenFrameBytes) {
    drop_client(connection, fmt::format("it sent a {}-byte frame before proving it knows the job secret", length));
    return std::nullopt;
  }
  if (length > max_request_frame_bytes()) {
    refuse(connection,
           fmt::format("a request of {} bytes exceeds the store's limit of {} bytes (values of at most {} bytes, "
                       "BRAID_STORE_MAX_VALUE_BYTES)", length, max_request_frame_bytes(), limits.max_value_bytes),
           fmt::format("it sent a {}-byte frame", length));
    return std::nullopt;
  }
  if (available >= 4 + length) {
    return std::string_view(connection.input).substr(connection.input_used + 4, length);
  }
  if (connection.frame_reserved < 4 + length) {
    // The whole frame is reserved from its header, before its body is read (NOTE [store budget]); its buffer is
    // allocated once, at its size.
    const size_t more = 4 + length - std::max(available, connection.frame_reserved);
    if (!make_room_for(connection, more)) {
      refuse_over_budget(connection, "a request frame", 4 + length);
      return std::nullopt;
    }
    connection.frame_reserved = 4 + length;
    connection.input.reserve(connection.input_used + 4 + length);
  }
  return std::nullopt;
}

void StoreServer::Impl::handle_request(Connection& connection, std::string_view body) {
  if (!connection.session_key.empty()) {
    const bool sealed = body.size() >= kStoreFrameMacBytes;
    const std::string_view content = body.substr(0, sealed ? body.size() - kStoreFrameMacBytes : 0);
    if (!sealed || !same_proof(std::string(body.substr(content.size())),
                               store_frame_mac(connection.session_key, FrameDirection::kRequest,
                                               connection.requests_seen, content))) {
      drop_client(connection, "a request's MAC does not match (altered, replayed or injected on the way)");
      return;
    }
    ++connection.requests_seen;
    body = content;
  }
  Decoder in(body, "request from a store client");
  const auto op = static_cast<Op>(in.u8());
  if (op == Op::kHello || op == Op::kProve) {
    handle_handshake(connection, op, in);
    return;
  }
  if (!connection.proven) {
    refuse(connection, "this store serves the job's processes only: set BRAID_JOB_SECRET to the job's secret",
           "it sent a request without proving it knows the job secret");
    return;
  }
  switch (op) {
    case Op::kHello:
    case Op::kProve:
      break;
    case Op::kSet: {
      std::string key = in.bytes();
      const std::string_view value = in.view();  // copied only once it is known to fit
      in.expect_end();
      if (!key_allowed(connection, key)) return;
      if (value.size() > limits.max_value_bytes) {
        refuse(connection,
               fmt::format("SET '{}': a value of {} bytes exceeds the store's limit of {} bytes "
                           "(BRAID_STORE_MAX_VALUE_BYTES)", key, value.size(), limits.max_value_bytes),
               fmt::format("it SET a value of {} bytes", value.size()));
        return;
      }
      const auto old = data.find(key);
      const size_t freed = old == data.end() ? 0 : entry_cost(old->first, old->second);
      const size_t cost = key.size() + value.size() + kStoreEntryOverheadBytes;
      if (cost > freed && !make_room_for(connection, cost - freed)) {
        refuse_over_budget(connection, fmt::format("SET '{}'", key), cost);
        return;
      }
      store(std::move(key), std::string(value));
      reply(connection, Encoder().u8(uint8_t(Status::kOk)));
      return;
    }
    case Op::kGet: {
      std::string key = in.bytes();
      const int64_t timeout_ms = in.i64();
      in.expect_end();
      if (!key_allowed(connection, key)) return;
      park(connection, Parked{op, {std::move(key)}, net::deadline_after(timeout_ms / 1000.0)});
      return;
    }
    case Op::kTryGet: {
      const std::string key = in.bytes();
      in.expect_end();
      const auto found = data.find(key);
      if (found == data.end()) {
        reply(connection, Encoder().u8(uint8_t(Status::kNotFound)));
      } else {
        reply(connection, Encoder().u8(uint8_t(Status::kOk)).bytes(found->second));
      }
      return;
    }
    case Op::kWait: {
      const uint32_t count = in.u32();
      if (count > kStoreMaxWaitKeys) {
        raise(ErrorCode::kRemoteError, "WAIT for {} keys (at most {})", count, kStoreMaxWaitKeys);
      }
      // What the keys will cost, at most, before they are made (the frame's bytes and each key's overhead).
      if (!make_room_for(connection, body.size() + size_t(count) * kStoreEntryOverheadBytes)) {
        refuse_over_budget(connection, "a WAIT", body.size() + size_t(count) * kStoreEntryOverheadBytes);
        return;
      }
      std::vector<std::string> keys;
      for (uint32_t i = 0; i < count; ++i) keys.push_back(in.bytes());  // truncation throws, no huge reserve
      const int64_t timeout_ms = in.i64();
      in.expect_end();
      for (const std::string& key : keys) {
        if (!key_allowed(connection, key)) return;
      }
      park(connection, Parked{op, std::move(keys), net::deadline_after(timeout_ms / 1000.0)});
      return;
    }
    case Op::kAdd: {
      const std::string key = in.bytes();
      const int64_t delta = in.i64();
      in.expect_end();
      add(connection, key, delta);
      return;
    }
    case Op::kDelete: {
      const std::string key = in.bytes();
      in.expect_end();
      const bool existed = erase(key);
      reply(connection, Encoder().u8(uint8_t(existed ? Status::kOk : Status::kNotFound)));
      return;
    }
  }
  raise(ErrorCode::kRemoteError, "unknown store operation {}", static_cast<int>(op));
}

// HELLO: the client's nonce; the answer proves this server knows the secret. PROVE: the client's proof, over
// both nonces; once it matches, the connection is served.
void StoreServer::Impl::handle_handshake(Connection& connection, Op op, Decoder& in) {
  std::string field = in.bytes();
  in.expect_end();
  if (secret.empty()) {
    refuse(connection, "this store has no job secret but the client proves one: set BRAID_JOB_SECRET alike in every "
                       "process of the job, or in none",
           "it proves a job secret this store does not have");
    return;
  }
  if (op == Op::kHello) {
    if (connection.proven || !connection.client_nonce.empty() || field.size() != kStoreNonceBytes) {
      refuse(connection, "malformed or repeated HELLO", "it sent a malformed or repeated HELLO");
      return;
    }
    connection.client_nonce = std::move(field);
    connection.server_nonce = store_nonce();
    const std::string proof = store_proof(secret, StoreRole::kServer, connection.client_nonce, connection.server_nonce);
    reply(connection, Encoder().u8(uint8_t(Status::kOk)).bytes(connection.server_nonce).bytes(proof));
    return;
  }
  if (connection.proven || connection.client_nonce.empty()) {
    refuse(connection, "the handshake is out of order: PROVE came before HELLO, or a second time",
           "it sent PROVE before HELLO, or twice");
    return;
  }
  const bool matches = same_proof(
      field, store_proof(secret, StoreRole::kClient, connection.client_nonce, connection.server_nonce));
  if (!matches) {
    refuse(connection, "the job secret does not match: BRAID_JOB_SECRET must be the same in every process of the job",
           "it does not know the job secret");
    return;
  }
  connection.proven = true;
  reply(connection, Encoder().u8(uint8_t(Status::kOk)));
  // From the next frame on, both ways: a MAC under this connection's key (the PROVE's reply is the last without).
  connection.session_key = store_session_key(secret, connection.client_nonce, connection.server_nonce);
}

// Answers REFUSED `message` (which the client raises) and closes the connection once the answer is sent.
void StoreServer::Impl::refuse(Connection& connection, const std::string& message, const std::string& why) {
  reply(connection, Encoder().u8(uint8_t(Status::kRefused)).bytes(message));
  connection.closing = true;
  warn("refused a client: " + why);
}

void StoreServer::Impl::add(Connection& connection, const std::string& key, int64_t delta) {
  if (!key_allowed(connection, key)) return;
  int64_t value = 0;
  auto found = data.find(key);
  if (found != data.end()) {
    const std::string& text = found->second;
    const char* end = text.data() + text.size();
    const auto [stop, ec] = std::from_chars(text.data(), end, value);
    if (ec != std::errc() || stop != end) {
      const std::string message = fmt::format("key '{}' holds a value that is not an integer", key);
      reply(connection, Encoder().u8(uint8_t(Status::kError)).bytes(message));
      return;
    }
  }
  if (__builtin_add_overflow(value, delta, &value)) {
    const std::string message = fmt::format("adding {} to key '{}' overflows int64", delta, key);
    reply(connection, Encoder().u8(uint8_t(Status::kError)).bytes(message));
    return;
  }
  std::string text = std::to_string(value);
  const size_t freed = found == data.end() ? 0 : entry_cost(found->first, found->second);
  const size_t cost = entry_cost(key, text);
  if (cost > freed && !make_room_for(connection, cost - freed)) {
    refuse_over_budget(connection, fmt::format("ADD '{}'", key), cost);
    return;
  }
  store(key, std::move(text));
  reply(connection, Encoder().u8(uint8_t(Status::kOk)).i64(value));
}

// Queues a reply; after the handshake it carries the connection's MAC.
void StoreServer::Impl::reply(Connection& connection, Encoder& encoder) {
  std::string frame = encoder.finish();
  if (!connection.session_key.empty()) {
    const std::string_view body(frame.data() + 4, frame.size() - 4);
    const std::string mac =
        store_frame_mac(connection.session_key, FrameDirection::kReply, connection.replies_sent++, body);
    frame += mac;
    const uint64_t length = frame.size() - 4;
    for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  }
  connection.output += frame;
}

// Parks a GET or WAIT, its keys counted against the budget; answered at once where its keys exist.
void StoreServer::Impl::park(Connection& connection, Parked parked) {
  size_t cost = 0;
  for (const std::string& key : parked.keys) cost += key.size() + kStoreEntryOverheadBytes;
  if (!make_room_for(connection, cost)) {
    refuse_over_budget(connection, parked.op == Op::kGet ? "a GET" : "a WAIT", cost);
    return;
  }
  // Parked even when present: release_parked() answers it in this same round.
  connection.parked = std::move(parked);
  connection.parked_bytes = cost;
}

bool StoreServer::Impl::key_allowed(Connection& connection, const std::string& key) {
  if (key.size() <= kStoreMaxKeyBytes) return true;
  refuse(connection, fmt::format("a key of {} bytes exceeds the store's limit of {} bytes", key.size(),
                                 kStoreMaxKeyBytes),
         fmt::format("it named a key of {} bytes", key.size()));
  return false;
}

size_t StoreServer::Impl::entry_cost(const std::string& key, const std::string& value) {
  return key.size() + value.size() + kStoreEntryOverheadBytes;
}

void StoreServer::Impl::store(std::string key, std::string value) {
  const size_t cost = entry_cost(key, value);
  auto [entry, inserted] = data.try_emplace(std::move(key));
  if (!inserted) stored_bytes -= entry_cost(entry->first, entry->second);
  entry->second = std::move(value);
  stored_bytes += cost;
}

bool StoreServer::Impl::erase(const std::string& key) {
  const auto found = data.find(key);
  if (found == data.end()) return false;
  stored_bytes -= entry_cost(found->first, found->second);
  data.erase(found);
  return true;
}

// Answers every parked request whose keys now exist or whose deadline has passed.
bool StoreServer::Impl::release_parked() {
  const auto now = net::Clock::now();
  bool released = false;
  for (auto& connection : connections) {
    if (!connection->parked || connection->dead) continue;
    try {
      if (try_answer(*connection, now)) released = true;
    } catch (const std::bad_alloc&) {
      drop_client(*connection, "the store ran out of memory answering its request");
    }
  }
  return released;
}

bool StoreServer::Impl::try_answer(Connection& connection, net::Clock::time_point now) {
  const Parked& parked = *connection.parked;
  const bool expired = now >= parked.deadline;
  if (parked.op == Op::kGet) {
    const auto found = data.find(parked.keys.front());
    if (found != data.end()) {
      // The reply copies the value: it must fit the budget (less the parked key it replaces).
      const size_t cost = found->second.size() + kStoreEntryOverheadBytes + kStoreFrameMacBytes;
      if (cost > connection.parked_bytes && !make_room_for(connection, cost - connection.parked_bytes)) {
        connection.parked.reset();
        connection.parked_bytes = 0;
        refuse_over_budget(connection, fmt::format("the reply to GET '{}'", found->first), cost);
        return true;
      }
      reply(connection, Encoder().u8(uint8_t(Status::kOk)).bytes(found->second));
    } else if (expired) {
      reply(connection, Encoder().u8(uint8_t(Status::kTimeout)));
    } else {
      return false;
    }
  } else {  // kWait
    std::vector<const std::string*> missing;
    for (const std::string& key : parked.keys) {
      if (!data.contains(key)) missing.push_back(&key);
    }
    if (!missing.empty() && !expired) return false;
    Encoder encoder;
    encoder.u8(uint8_t(Status::kOk)).u32(static_cast<uint32_t>(missing.size()));
    for (const std::string* key : missing) encoder.bytes(*key);
    reply(connection, encoder);
  }
  connection.parked.reset();
  connection.parked_bytes = 0;
  return true;
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

// ---------------------------------------------------------------------------------------------------
// Client side

namespace {

// A request failed halfway: the byte stream is in an unknown state, so the connection is given up.
[[noreturn]] void raise_exchange_failure(const std::string& address, const std::string& what,
                                         net::Deadline deadline, double timeout_s) {
  if (net::Clock::now() >= deadline) {
    raise(ErrorCode::kTimeout, "store {}: no reply to {} within {} s (server hung or overloaded?)", address,
          what, timeout_s);
  }
  raise(ErrorCode::kRemoteError, "store {}: the connection closed during {}: the server exited, dropped this "
        "client, or is not braid's store (another process holding the port?)", address, what);
}

[[noreturn]] void raise_unexpected(const std::string& address, const std::string& what, Status status) {
  raise(ErrorCode::kRemoteError, "store {}: unexpected reply status {} to {}", address,
        static_cast<int>(status), what);
}

std::string quoted(const char* op, const std::string& key) { return fmt::format("{} '{}'", op, key); }

// The reply's status; a refusal is raised with the server's reason.
Status status_of(Decoder& in, const std::string& address, const std::string& what) {
  const auto status = static_cast<Status>(in.u8());
  if (status == Status::kRefused) {
    raise(ErrorCode::kRemoteError, "store {}: {} refused: {}", address, what, in.bytes());
  }
  return status;
}

}  // namespace

StoreClient::StoreClient(const std::string& host, int port, double timeout_s, std::optional<std::string> secret)
    : address_(fmt::format("{}:{}", host, port)), request_timeout_s_(std::max(timeout_s, kMinRequestTimeoutS)) {
  const std::string job = secret ? std::move(*secret) : job_secret();
  std::string last_error;
  fd_ = net::tcp_connect(host, port, net::deadline_after(timeout_s), &last_error);
  if (fd_ < 0) {
    raise(ErrorCode::kTimeout, "store client: no store server answered at {} within {} s (last attempt: {})",
          address_, timeout_s, last_error);
  }
  try {
    if (!job.empty()) prove(job);
  } catch (...) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    throw;
  }
  BRAID_DEBUG("connected to store {}{}", address_, job.empty() ? "" : " (job secret proven both ways)");
}

// Shut down, not closed: the fd stays this client's until its destructor, so interrupt() never reaches another.
void StoreClient::lose_connection() {
  ::shutdown(fd_, SHUT_RDWR);
  lost_ = true;
}

void StoreClient::interrupt(ErrorCode code, std::string_view reason) noexcept {
  interrupted_.end(code, reason);
  ::shutdown(fd_, SHUT_RDWR);  // a blocked read or write returns; the fd stays this client's
}

void StoreClient::interrupt() noexcept {
  interrupted_.abort();
  ::shutdown(fd_, SHUT_RDWR);
}

void StoreClient::prove(const std::string& secret) {
  const std::string client_nonce = store_nonce();
  const std::string hello =
      exchange(Encoder().u8(uint8_t(Op::kHello)).bytes(client_nonce).finish(), request_timeout_s_, "HELLO");
  Decoder in(hello, address_);
  const Status hello_status = status_of(in, address_, "HELLO");
  if (hello_status != Status::kOk) raise_unexpected(address_, "HELLO", hello_status);
  const std::string server_nonce = in.bytes();
  const std::string server_proof = in.bytes();
  if (!same_proof(server_proof, store_proof(secret, StoreRole::kServer, client_nonce, server_nonce))) {
    raise(ErrorCode::kRemoteError, "store {}: the server does not know the job secret (BRAID_JOB_SECRET differs "
          "between processes, or another process holds the store's port); no key was sent or read", address_);
  }
  const std::string proof = store_proof(secret, StoreRole::kClient, client_nonce, server_nonce);
  const std::string proven =
      exchange(Encoder().u8(uint8_t(Op::kProve)).bytes(proof).finish(), request_timeout_s_, "PROVE");
  Decoder answer(proven, address_);
  const Status prove_status = status_of(answer, address_, "PROVE");
  if (prove_status != Status::kOk) raise_unexpected(address_, "PROVE", prove_status);
  session_key_ = store_session_key(secret, client_nonce, server_nonce);
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) close(fd_);
}

std::string StoreClient::exchange(const std::string& request, double reply_timeout_s, const std::string& what) {
  std::lock_guard lock(mutex_);
  auto raise_if_interrupted = [&] {
    if (interrupted_.ended()) interrupted_.raise(fmt::format("store {}: {}", address_, what));
  };
  raise_if_interrupted();
  if (lost_) {
    raise(ErrorCode::kRemoteError, "store {}: cannot send {}: the connection was lost by an earlier request",
          address_, what);
  }
  const net::Deadline deadline = net::deadline_after(reply_timeout_s);
  std::string sealed;
  if (!session_key_.empty()) {  // the request's MAC, its length in the frame's
    sealed = request + store_frame_mac(session_key_, FrameDirection::kRequest, sent_frames_++,
                                       std::string_view(request).substr(4));
    const uint64_t length = sealed.size() - 4;
    for (int i = 0; i < 4; ++i) sealed[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  }
  const std::string& frame = session_key_.empty() ? request : sealed;
  const bool sent = net::write_all(fd_, frame.data(), frame.size(), deadline);
  // A server that refuses a request (one over its limits) answers and closes before reading all of it: look for
  // that answer too, briefly, when sending failed.
  const net::Deadline reply_deadline = sent ? deadline : std::min(deadline, net::deadline_after(1.0));
  char header[4];
  bool ok = net::read_all(fd_, header, sizeof(header), reply_deadline);
  std::string body;
  if (ok) {
    const uint64_t length = read_little_endian(header, 4);
    ok = length <= kMaxFrameBytes;
    if (ok) {
      body.resize(length);
      ok = net::read_all(fd_, body.data(), body.size(), reply_deadline);
    }
  }
  if (ok && !session_key_.empty()) {
    const bool authentic =
        body.size() >= kStoreFrameMacBytes &&
        same_proof(body.substr(body.size() - kStoreFrameMacBytes),
                   store_frame_mac(session_key_, FrameDirection::kReply, received_frames_,
                                   std::string_view(body).substr(0, body.size() - kStoreFrameMacBytes)));
    if (!authentic) {
      lose_connection();
      raise(ErrorCode::kRemoteError, "store {}: the reply to {} does not carry this connection's MAC: something "
            "between this client and the store altered or injected it; the connection is given up", address_, what);
    }
    ++received_frames_;
    body.resize(body.size() - kStoreFrameMacBytes);
  }
  if (!ok || (!sent && !body.empty() && static_cast<Status>(body[0]) != Status::kRefused)) {
    raise_if_interrupted();
    lose_connection();
    raise_exchange_failure(address_, what, deadline, reply_timeout_s);
  }
  if (!sent) lose_connection();  // the refusal, raised by the caller's status_of; the server closes the connection
  return body;
}

void StoreClient::set(const std::string& key, const std::string& value) {
  const std::string what = quoted("SET", key);
  const std::string body =
      exchange(Encoder().u8(uint8_t(Op::kSet)).bytes(key).bytes(value).finish(), request_timeout_s_, what);
  Decoder in(body, address_);
  const auto status = status_of(in, address_, what);
  if (status != Status::kOk) raise_unexpected(address_, what, status);
}

std::string StoreClient::get(const std::string& key, double timeout_s) {
  const std::string what = quoted("GET", key);
  const std::string request = Encoder().u8(uint8_t(Op::kGet)).bytes(key).i64(timeout_to_ms(timeout_s)).finish();
  const std::string body = exchange(request, std::max(timeout_s, 0.0) + kWaitReplyMarginS, what);
  Decoder in(body, address_);
  const auto status = status_of(in, address_, what);
  if (status == Status::kTimeout) {
    raise(ErrorCode::kTimeout, "store {}: key '{}' did not appear within {} s", address_, key, timeout_s);
  }
  if (status != Status::kOk) raise_unexpected(address_, what, status);
  return in.bytes();
}

std::optional<std::string> StoreClient::try_get(const std::string& key) {
  const std::string what = quoted("TRY_GET", key);
  const std::string body =
      exchange(Encoder().u8(uint8_t(Op::kTryGet)).bytes(key).finish(), request_timeout_s_, what);
  Decoder in(body, address_);
  const auto status = status_of(in, address_, what);
  if (status == Status::kNotFound) return std::nullopt;
  if (status != Status::kOk) raise_unexpected(address_, what, status);
  return in.bytes();
}

std::vector<std::string> StoreClient::wait(const std::vector<std::string>& keys, double timeout_s) {
  const std::string what = fmt::format("WAIT for {} key(s)", keys.size());
  if (keys.size() > kStoreMaxWaitKeys) {
    raise_invalid_argument("StoreClient::wait", "keys", "names {} keys; a WAIT takes at most {}", keys.size(),
                           kStoreMaxWaitKeys);
  }
  Encoder encoder;
  encoder.u8(uint8_t(Op::kWait)).u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys) encoder.bytes(key);
  encoder.i64(timeout_to_ms(timeout_s));
  const std::string body =
      exchange(encoder.finish(), std::max(timeout_s, 0.0) + kWaitReplyMarginS, what);
  Decoder in(body, address_);
  const auto status = status_of(in, address_, what);
  if (status != Status::kOk) raise_unexpected(address_, what, status);
  const uint32_t count = in.u32();
  std::vector<std::string> missing;
  for (uint32_t i = 0; i < count; ++i) missing.push_back(in.bytes());
  return missing;
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  const std::string what = quoted("ADD", key);
  const std::string body =
      exchange(Encoder().u8(uint8_t(Op::kAdd)).bytes(key).i64(delta).finish(), request_timeout_s_, what);
  Decoder in(body, address_);
  const auto status = status_of(in, address_, what);
  if (status == Status::kError) {
    raise(ErrorCode::kInvalidArgument, "store {}: {} refused: {}", address_, what, in.bytes());
  }
  if (status != Status::kOk) raise_unexpected(address_, what, status);
  return in.i64();
}

bool StoreClient::remove(const std::string& key) {
  const std::string what = quoted("DELETE", key);
  const std::string body =
      exchange(Encoder().u8(uint8_t(Op::kDelete)).bytes(key).finish(), request_timeout_s_, what);
  Decoder in(body, address_);
  const auto status = status_of(in, address_, what);
  if (status == Status::kNotFound) return false;
  if (status != Status::kOk) raise_unexpected(address_, what, status);
  return true;
}

// ---------------------------------------------------------------------------------------------------
// StoreHost

namespace {

// The host that clients on this machine should dial for a server bound to `bind_host`: a wildcard
// address is not dialable, so use loopback; IPv6 literals need brackets in "host:port".
std::string dialable_host(const std::string& bind_host) {
  if (bind_host.empty() || bind_host == "0.0.0.0") return "127.0.0.1";
  if (bind_host == "::") return "[::1]";
  if (bind_host.find(':') != std::string::npos) return "[" + bind_host + "]";
  return bind_host;
}

}  // namespace

namespace {

int store_host_port(int port) {
  if (port < 0 || port > 65535) {
    raise_invalid_argument("StoreHost", "port", "must be in [0, 65535] (0: a free port), got {}", port);
  }
  return port;
}

}  // namespace

StoreHost::StoreHost(const std::string& bind_host, int port)
    : host_(dialable_host(bind_host)), server_(std::make_unique<StoreServer>(bind_host, store_host_port(port))) {
  log_enabled(LogLevel::kWarn);  // prints, once, the warnings about unknown BRAID_* names (typos)
}

StoreHost::~StoreHost() = default;

std::string StoreHost::address() const { return fmt::format("{}:{}", host_, server_->port()); }

}  // namespace braid

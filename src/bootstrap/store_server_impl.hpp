// The store server's own state: its connections, what each costs the budget (NOTE [store budget],
// store_server.cpp), and StoreServer::Impl, whose work store_server.cpp (the poll loop, connections, budget) and
// store_requests.cpp (requests and their replies) share.
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/store_wire.hpp"
#include "core/rate_limit.hpp"

namespace braid {
namespace store_server {

// Room a request frame has beyond its value, for its key and fields: a SET of the largest value fits.
constexpr size_t kRequestFrameOverhead = kStoreMaxKeyBytes + 64 + kStoreFrameMacBytes;
// Request frames that carry no value (a WAIT for many keys) may still be this long.
constexpr size_t kMinRequestFrameBytes = size_t(4) << 20;
// Largest frame a connection may send before it proved it knows the job secret (HELLO and PROVE are ~40 bytes).
constexpr uint32_t kMaxUnprovenFrameBytes = 256;
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

// A GET or WAIT waiting for keys. While a connection has one, its further requests stay buffered, so
// replies keep the order of requests.
struct Parked {
  store_wire::Op op;
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

}  // namespace store_server

struct StoreServer::Impl {
  using Connection = store_server::Connection;
  using Parked = store_server::Parked;
  using Decoder = store_wire::Decoder;
  using Encoder = store_wire::Encoder;
  using Op = store_wire::Op;

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
    using namespace store_server;
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
  RateLimit warnings{store_server::kWarningsPerMinute, std::chrono::minutes(1)};
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

}  // namespace braid

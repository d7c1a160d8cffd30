// A TCP key-value store: the rendezvous point of a job. Rank 0 (or braid-run) serves it; every rank
// is a client. Values are byte strings. Every wait is bounded. With a job secret, only clients that prove they
// know it are served, and clients talk only to a server that proves it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "braid/error.hpp"
#include "core/interruption.hpp"

namespace braid {

// Serves the store from a background thread until destroyed.
// What clients may make the server hold (docs/security.md); tests shrink them.
struct StoreLimits {
  double slow_client_s = 60.0;  // a request frame begun and not finished for this long: the client is dropped
  // One byte budget for the whole store: stored keys and values, request bytes received and not yet handled (a
  // frame's whole length is reserved once its header is in), replies not yet sent, the keys of parked GET/WAITs.
  // A request that does not fit drops the clients holding more than its own would with it and at least
  // 1/kStoreDroppableShare of the budget (largest first, where that makes the room); otherwise it is refused with
  // an error naming the limit. 0: BRAID_STORE_BUDGET_BYTES.
  size_t budget_bytes = 0;
  size_t max_value_bytes = 0;  // largest value a SET may store; 0: BRAID_STORE_MAX_VALUE_BYTES
  double prove_within_s = 5.0;  // with a job secret: a connection that has not proved it this long is closed
  size_t max_unproven_connections = 64;  // with a job secret: beyond, the oldest unproven connection is closed
};

// What a stored key, a parked key or a reply costs the budget beyond its bytes (the containers' own memory).
constexpr size_t kStoreEntryOverheadBytes = 64;
// A request that does not fit the budget drops only clients holding at least 1/kStoreDroppableShare of it.
constexpr size_t kStoreDroppableShare = 64;
constexpr size_t kStoreMaxWaitKeys = 65536;  // keys one WAIT may name: the server rescans them every round
constexpr size_t kStoreMaxKeyBytes = 4096;   // longest key a request may name

class StoreServer {
 public:
  // Listens on bind_host:port, on every address the name resolves to (so no other process can take one of
  // them, e.g. [::1] beside 127.0.0.1 for localhost, and be dialled first); port 0 picks a free port (see port()). `secret`: the job secret every client
  // must prove it knows before it is served (bootstrap/job_secret.hpp); unset: BRAID_JOB_SECRET, and an empty
  // one serves every client (with a warning, once, where bind_host is not loopback).
  // Throws Error(kSystemError) naming the address when it cannot listen on one of them (another process holds
  // it). Raises the process's descriptor soft limit to its hard limit, so many ranks' connections fit.
  explicit StoreServer(const std::string& bind_host = "127.0.0.1", int port = 0, StoreLimits limits = {},
                       std::optional<std::string> secret = std::nullopt);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A connection to a store. Thread-safe: calls from several threads are serialised.
class StoreClient {
 public:
  // Connects to host:port, retrying until timeout_s passes (the server may start after the client), then, with
  // a job secret (`secret`; unset: BRAID_JOB_SECRET), proves it knows it and checks that the server does; every
  // frame after that carries a MAC under a key of this connection (store_wire.hpp), so nobody between the two ends
  // can alter, drop, replay or inject a request or a reply unnoticed.
  // Throws Error(kTimeout) naming the address when no server answers in time; kRemoteError when the server
  // refuses this client or does not know the secret (before any key is sent or read).
  StoreClient(const std::string& host, int port, double timeout_s, std::optional<std::string> secret = std::nullopt);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits until `key` exists, then returns its value. Throws Error(kTimeout) naming the key.
  std::string get(const std::string& key, double timeout_s);
  // Returns the value if `key` exists now.
  std::optional<std::string> try_get(const std::string& key);
  // Waits until every key exists or timeout_s passes; returns the keys still missing (empty: all there). At
  // most kStoreMaxWaitKeys keys (kInvalidArgument beyond).
  std::vector<std::string> wait(const std::vector<std::string>& keys, double timeout_s);
  // Adds delta to the integer at `key` (absent counts as 0) and returns the new value, atomically.
  int64_t add(const std::string& key, int64_t delta);
  // Deletes `key`; returns whether it existed.
  bool remove(const std::string& key);

  const std::string& address() const { return address_; }  // "host:port", for messages

  // From any thread: a request under way ends at once, and it and every later one raise `code` with `reason`
  // (NOTE [ended host waits]: kAborted replaces an earlier end, another code is dropped after one). Never throws.
  void interrupt(ErrorCode code, std::string_view reason) noexcept;
  void interrupt() noexcept;  // the communicator that owns this client was aborted: kAborted

 private:
  // Sends one request frame and returns the reply's body; `reply_timeout_s` bounds the whole exchange.
  // Throws kRemoteError (server gone) or kTimeout (no reply in time), naming the store and `what`.
  std::string exchange(const std::string& request, double reply_timeout_s, const std::string& what);
  // The job-secret handshake (HELLO, PROVE).
  void prove(const std::string& secret);

  std::string address_;
  std::string session_key_;  // with a job secret: the key of this connection's frame MACs
  uint64_t sent_frames_ = 0, received_frames_ = 0;  // the MACs' sequence numbers
  void lose_connection();  // after a failed exchange left the stream in an unknown state

  int fd_ = -1;  // set once by the constructor and closed by the destructor alone, so interrupt() reads it unlocked
  bool lost_ = false;  // a failed exchange lost the connection: later requests raise
  double request_timeout_s_ = 0;  // bound on requests that never wait server-side
  std::mutex mutex_;
  Interruption interrupted_;
};

}  // namespace braid

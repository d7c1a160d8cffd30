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
#include <vector>

namespace braid {

// Serves the store from a background thread until destroyed.
// What clients may make the server hold, beyond the per-connection bounds of store.cpp (frame size, unread
// replies): tests shrink them.
struct StoreLimits {
  double slow_client_s = 60.0;  // a request frame begun and not finished for this long, or (with a job secret)
                                // a connection that has not proved the secret this long: the client is dropped
  size_t buffered_input_bytes = size_t(512) << 20;  // unparsed request bytes of all clients together; beyond,
                                                     // the client holding the most is dropped
};

constexpr size_t kStoreMaxWaitKeys = 65536;  // keys one WAIT may name: the server rescans them every round

class StoreServer {
 public:
  // Listens on bind_host:port; port 0 picks a free port (see port()). `secret`: the job secret every client
  // must prove it knows before it is served (bootstrap/job_secret.hpp); unset: BRAID_JOB_SECRET, and an empty
  // one serves every client (with a warning, once, where bind_host is not loopback).
  // Throws Error(kSystemError) naming the address when it cannot listen.
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
  // a job secret (`secret`; unset: BRAID_JOB_SECRET), proves it knows it and checks that the server does.
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

 private:
  // Sends one request frame and returns the reply's body; `reply_timeout_s` bounds the whole exchange.
  // Throws kRemoteError (server gone) or kTimeout (no reply in time), naming the store and `what`.
  std::string exchange(const std::string& request, double reply_timeout_s, const std::string& what);
  // The job-secret handshake (HELLO, PROVE).
  void prove(const std::string& secret);

  std::string address_;
  int fd_ = -1;  // -1 once a failed exchange left the stream in an unknown state
  double request_timeout_s_ = 0;  // bound on requests that never wait server-side
  std::mutex mutex_;
};

}  // namespace braid

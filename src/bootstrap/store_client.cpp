// The store's client: one request, then its reply, at a time over one connection; with a job secret, the
// handshake first and a MAC on every frame after. The wire protocol is store_wire.hpp's.
#include "bootstrap/store.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/store_wire.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid {

using namespace store_wire;

namespace {

// A blocking GET/WAIT's reply is due when the server-side timeout passes; the client waits this much
// longer before it calls the server unresponsive.
constexpr double kWaitReplyMarginS = 2.0;
// Requests that never wait server-side still get at least this long (a busy server is not a dead one).
constexpr double kMinRequestTimeoutS = 1.0;

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
}  // namespace braid

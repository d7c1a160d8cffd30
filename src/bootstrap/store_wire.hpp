// The store's wire protocol, spoken by StoreServer (store_server.cpp) and StoreClient (store_client.cpp).
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
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace braid::store_wire {

enum class Op : uint8_t { kSet = 1, kGet = 2, kTryGet = 3, kWait = 4, kAdd = 5, kDelete = 6, kHello = 7, kProve = 8 };
enum class Status : uint8_t { kOk = 0, kNotFound = 1, kTimeout = 2, kError = 3, kRefused = 4 };

// Largest frame a client accepts: a bound on what a confused or hostile server can make it allocate. The server's
// bound is smaller (max_request_frame_bytes).
constexpr uint32_t kMaxFrameBytes = 1u << 30;

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

inline uint64_t read_little_endian(const char* data, int width) {
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

inline int64_t timeout_to_ms(double seconds) {
  if (!(seconds > 0)) return 0;
  return static_cast<int64_t>(std::ceil(std::min(seconds, 1e9) * 1000.0));
}
}  // namespace braid::store_wire

// The store server's requests: frames cut from a connection's input, each request handled in order and answered,
// and the job-secret handshake. GET and WAIT are parked in the server until their keys exist or their timeout
// passes, so a client never polls.
// ADD keeps the counter as decimal text, so GET returns it as such.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/store_server_impl.hpp"
#include "bootstrap/store_wire.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid {

using namespace store_server;
using namespace store_wire;

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

}  // namespace braid

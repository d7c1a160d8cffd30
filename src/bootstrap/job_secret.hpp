// The job secret: what every connection to a job's store proves it knows, so that across hosts only the job's
// own processes use the store (on one host the kernel's credentials check fd passing as well). braid-run
// generates one for its ranks; other launchers pass one in BRAID_JOB_SECRET. The secret itself never goes into a
// log line or an error message.
//
// The proof is a challenge in both directions: the client sends a fresh nonce, the server answers with its own
// nonce and an HMAC-SHA256 over both, and the client answers with an HMAC over both in its own role. Neither side
// sends the secret, a recorded exchange does not replay (fresh nonces), and a client learns that the server knows
// the secret before it sends or reads any key (a process that took the store's port first gets nothing).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace braid {

class Config;

constexpr size_t kMinJobSecretBytes = 16;
constexpr size_t kStoreNonceBytes = 32;

// BRAID_JOB_SECRET of `config` (empty: none). A secret shorter than kMinJobSecretBytes is refused
// (kInvalidArgument naming the variable, not its value).
std::string job_secret(const Config& config);
std::string job_secret();  // of the process environment (Config::get())

// A new secret for a job: kStoreNonceBytes random bytes as hex.
std::string generate_job_secret();

// kStoreNonceBytes random bytes.
std::string store_nonce();

// Who proves: the server answers a client's nonce first, then the client proves it knows the secret too.
enum class StoreRole { kServer, kClient };

// HMAC-SHA256 of (role, client_nonce, server_nonce) keyed with the secret.
std::string store_proof(const std::string& secret, StoreRole role, const std::string& client_nonce,
                        const std::string& server_nonce);

// The key of one store connection's frame MACs, from the secret and both nonces of its handshake: a connection
// whose handshake was relayed or recorded has a key nobody without the secret can compute.
std::string store_session_key(const std::string& secret, const std::string& client_nonce,
                              const std::string& server_nonce);

// Which way a store frame goes: its MAC says so, so a request cannot be reflected as a reply.
enum class FrameDirection : uint8_t { kRequest = 1, kReply = 2 };

// The MAC a store frame carries after the handshake (32 bytes): HMAC-SHA256 keyed with the session key over the
// direction, the frame's sequence number on its connection (each direction counts from 0) and its body.
std::string store_frame_mac(const std::string& session_key, FrameDirection direction, uint64_t sequence,
                            std::string_view body);
constexpr size_t kStoreFrameMacBytes = 32;

// HMAC-SHA256 of `message` keyed with the secret (32 bytes): what the store's proofs and signed memory handles
// (memory/memory_handle.hpp) carry.
std::string job_mac(const std::string& secret, std::string_view message);

// Whether two proofs are equal, in time that does not depend on where they differ.
bool same_proof(const std::string& a, const std::string& b);

}  // namespace braid

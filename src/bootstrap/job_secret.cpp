#include "bootstrap/job_secret.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include <fmt/format.h>

#include "core/config.hpp"
#include "core/error.hpp"

namespace braid {

std::string job_secret(const Config& config) {
  std::string secret = config.string("BRAID_JOB_SECRET").value_or("");
  if (!secret.empty() && secret.size() < kMinJobSecretBytes) {
    raise(ErrorCode::kInvalidArgument,
          "environment variable BRAID_JOB_SECRET is {} bytes long; a job secret has at least {} (braid-run makes one)",
          secret.size(), kMinJobSecretBytes);
  }
  return secret;
}

std::string job_secret() { return job_secret(Config::get()); }

std::string store_nonce() {
  std::string nonce(kStoreNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    raise(ErrorCode::kSystemError, "RAND_bytes could not make a store nonce");
  }
  return nonce;
}

std::string generate_job_secret() {
  std::string hex;
  for (const char byte : store_nonce()) hex += fmt::format("{:02x}", static_cast<unsigned char>(byte));
  return hex;
}

std::string job_mac(const std::string& secret, std::string_view message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &length) == nullptr) {
    raise(ErrorCode::kSystemError, "HMAC-SHA256 with the job secret failed");
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

std::string store_proof(const std::string& secret, StoreRole role, const std::string& client_nonce,
                        const std::string& server_nonce) {
  std::string message = role == StoreRole::kServer ? "braid store server" : "braid store client";
  message += '\0';
  message += client_nonce;
  message += server_nonce;
  return job_mac(secret, message);
}

std::string store_session_key(const std::string& secret, const std::string& client_nonce,
                              const std::string& server_nonce) {
  return job_mac(secret, "braid store session" + client_nonce + server_nonce);
}

std::string store_frame_mac(const std::string& session_key, FrameDirection direction, uint64_t sequence,
                            std::string_view body) {
  std::string message(9 + body.size(), '\0');
  message[0] = static_cast<char>(direction);
  for (int i = 0; i < 8; ++i) message[1 + i] = static_cast<char>((sequence >> (8 * i)) & 0xff);
  std::memcpy(message.data() + 9, body.data(), body.size());
  return job_mac(session_key, message);
}

bool same_proof(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace braid

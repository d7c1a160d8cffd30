#include "bootstrap/job_secret.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

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

bool same_proof(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace braid

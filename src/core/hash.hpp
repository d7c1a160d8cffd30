// Hashes that are the same in every process, host and build (std::hash is not guaranteed to be), for values that
// ranks derive independently and must agree on: FNV-1a of text (names, ports), and a 64-bit mixer of words.
#pragma once

#include <cstdint>
#include <string_view>

namespace braid {

inline uint64_t stable_hash(std::string_view text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

// A bijective mixer of 64-bit words (splitmix64's finaliser): every input bit moves every output bit.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace braid

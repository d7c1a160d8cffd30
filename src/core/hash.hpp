// A hash that is the same in every process, host and build (std::hash is not guaranteed to be): FNV-1a.
// For names and ports that ranks derive independently and must agree on.
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

}  // namespace braid

// The arguments of the local reduction that follows copy-engine pulls (plain data, passed by value): every
// source is in this GPU's memory (this rank's input, and the peers' blocks that copy engines brought into
// staging), so the kernel has no peer to wait for.
#pragma once

#include <cstddef>

#include "core/limits.hpp"

namespace braid::kernels {

struct LocalReduceLaunch {
  const char* sources[kMaxWorld];  // in rank order (the order every braid reduction combines in); 16-byte aligned
  int source_count;
  char* destination;  // any alignment
  size_t count;       // elements
  int world;          // avg divides by it
};

}  // namespace braid::kernels

// Pattern kernels for checking peer memory: a writer fills bytes with a value derived from
// (seed, writer, owner, index), the owner checks them. Shared by braid-bench's smoke run and the GPU tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace braid::check {

struct PatternCheck {
  uint64_t wrong = 0;       // bytes that differ
  uint64_t first_bad = 0;   // index of the first differing byte (valid when wrong > 0)
  uint32_t expected = 0;    // its expected value
  uint32_t got = 0;         // what was there
};

// Writes `bytes` bytes of the (seed, writer, owner) pattern at `destination` (any alignment, any device
// memory the current device can write: local, a peer mapping, a contiguous view).
void write_pattern(void* destination, size_t bytes, uint64_t seed, int writer, int owner, cudaStream_t stream);

// Fills with a byte that no pattern uses for every index (poison before a check).
void poison(void* destination, size_t bytes, cudaStream_t stream);

// Compares `bytes` bytes at `source` with the pattern; synchronises `stream`.
PatternCheck check_pattern(const void* source, size_t bytes, uint64_t seed, int writer, int owner, cudaStream_t stream);

}  // namespace braid::check

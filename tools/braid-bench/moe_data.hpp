// braid-bench --moe's workload on the host: the routing every rank draws from the shared seed, and the values of
// token rows as the checks see them (bits, decoded values, tolerances, which rows and tokens are sampled).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "braid/types.hpp"

namespace braid::bench::moe {

// splitmix64's finaliser: the routing's draws, and each T's seed (mix(shared seed + T)).
uint64_t mix(uint64_t z);

struct Routing {  // one rank's: [T, K]
  std::vector<int64_t> ids;
  std::vector<float> weights;
};

// K distinct experts per token, uniform over E; weights in (0, 1]. Every rank can make every rank's.
Routing make_routing(uint64_t seed, int rank, size_t tokens, int top_k, int experts);

// The bits of value k / 128 in the row type, and a row element's value.
uint32_t value_bits(DataType type, int k);
double decode(DataType type, const unsigned char* p);
// A row element's bits as stored (1, 2 or 4 bytes), for comparing bit for bit.
uint32_t load_bits(DataType type, const unsigned char* p);
// A bound on the relative error of one rounding to `type` (for float32 a loose one, 2^-20); check_combined allows
// one per partial sum, plus one.
double tolerance_unit(DataType type);

// Indices of `samples` elements spread evenly over [0, n) (all of them when n <= samples), the last one included.
std::vector<size_t> spread(size_t n, size_t samples);

}  // namespace braid::bench::moe

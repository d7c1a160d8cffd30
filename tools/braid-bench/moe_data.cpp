// braid-bench --moe's routing and row values on the host (moe_data.hpp).
#include "moe_data.hpp"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace braid::bench::moe {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Routing make_routing(uint64_t seed, int rank, size_t tokens, int top_k, int experts) {
  Routing r;
  r.ids.resize(tokens * top_k);
  r.weights.resize(tokens * top_k);
  uint64_t state = mix(seed ^ mix(0xE0E0ull + static_cast<uint64_t>(rank)));
  auto next = [&] { return mix(state += kGolden); };
  for (size_t t = 0; t < tokens; ++t) {
    int64_t* ids = r.ids.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      int64_t e = 0;
      do {
        e = static_cast<int64_t>(next() % static_cast<uint64_t>(experts));
      } while (std::find(ids, ids + k, e) != ids + k);
      ids[k] = e;
      r.weights[t * top_k + k] = static_cast<float>(1 + next() % 1024) / 1024.0f;
    }
  }
  return r;
}

uint32_t value_bits(DataType type, int k) {
  const float value = static_cast<float>(k) / 128.0f;
  uint32_t bits = 0;
  switch (type) {
    case DataType::kFloat32: std::memcpy(&bits, &value, 4); return bits;
    case DataType::kBFloat16: std::memcpy(&bits, &value, 4); return bits >> 16;  // exact: 7 significant bits at most
    case DataType::kFloat16: {
      const __half h = __float2half_rn(value);
      uint16_t b = 0;
      std::memcpy(&b, &h, 2);
      return b;
    }
    default: throw std::logic_error("--moe: rows are bfloat16, float16 or float32");
  }
}

double decode(DataType type, const unsigned char* p) {
  switch (type) {
    case DataType::kFloat32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DataType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      const uint32_t u = static_cast<uint32_t>(b) << 16;
      float v;
      std::memcpy(&v, &u, 4);
      return v;
    }
    case DataType::kFloat16: {
      __half h;
      std::memcpy(&h, p, 2);
      return static_cast<double>(__half2float(h));
    }
    default: throw std::logic_error("--moe: rows are bfloat16, float16 or float32");
  }
}

uint32_t load_bits(DataType type, const unsigned char* p) {
  if (datatype_size(type) == 1) return *p;
  if (datatype_size(type) == 4) {
    uint32_t b;
    std::memcpy(&b, p, 4);
    return b;
  }
  uint16_t b;
  std::memcpy(&b, p, 2);
  return b;
}

double tolerance_unit(DataType type) {
  return type == DataType::kBFloat16 ? 0x1p-7 : type == DataType::kFloat16 ? 0x1p-10 : 0x1p-20;
}

std::vector<size_t> spread(size_t n, size_t samples) {
  std::vector<size_t> picks;
  if (n == 0) return picks;
  if (n <= samples) {
    for (size_t i = 0; i < n; ++i) picks.push_back(i);
    return picks;
  }
  for (size_t i = 0; i < samples; ++i) picks.push_back(i * (n - 1) / (samples - 1));
  return picks;
}

}  // namespace braid::bench::moe

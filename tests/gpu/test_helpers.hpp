// Helpers the GPU tests of all-to-all and send/recv share: random inputs (never zero, never the poison), argument
// error checks, and CUDA graph handles.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"

namespace braid::testing {

// ---- Inputs: element i of a buffer is a function of (key, i), never zero, never the poison ----

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The key of `rank`'s inputs for a call seeded `seed`.
inline uint64_t input_key(uint64_t seed, int rank) { return mix64(seed ^ mix64(0xA11A11ull + static_cast<uint64_t>(rank))); }
// Random bits number `index` of the stream `key`.
inline uint64_t random_bits(uint64_t key, uint64_t index) { return mix64(key + (index + 1) * kGolden); }

template <typename Bits, typename Make>
void fill_bits(uint64_t key, size_t first, size_t count, unsigned char* out, Make make) {
  for (size_t i = 0; i < count; ++i) {
    const Bits bits = make(random_bits(key, first + i));
    std::memcpy(out + i * sizeof(Bits), &bits, sizeof(Bits));
  }
}

// Integers: random bits, nudged off zero and the poison pattern.
template <typename Bits>
Bits integer_value(uint64_t r) {
  Bits poison;
  std::memset(&poison, kPoison, sizeof poison);
  const Bits value = static_cast<Bits>(r);
  return value == 0 || value == poison ? static_cast<Bits>(value ^ 0x11) : value;
}

// Floats: a random sign and mantissa, exponents in [low, low + span): finite, normal, never zero, and never the
// poison's exponent (0xA5.. has exponent 9 in float16, 75 in bfloat16 and float32, 602 in float64, 4 in fp8
// e4m3, 9 in e5m2), nor fp8's NaN and infinity (exponent 15 in e4m3, 31 in e5m2).
template <typename Bits, int kMantissaBits, int kExponentBits, unsigned kLow, unsigned kSpan>
Bits float_value(uint64_t r) {
  const uint64_t sign = r >> 63;
  const uint64_t exponent = kLow + ((r >> 53) & 0x3FF) % kSpan;
  const uint64_t mantissa = r & ((uint64_t(1) << kMantissaBits) - 1);
  return static_cast<Bits>((sign << (kMantissaBits + kExponentBits)) | (exponent << kMantissaBits) | mantissa);
}

// Elements [first, first + count) of the send buffer of the rank whose key this is.
inline void fill_inputs(DataType type, uint64_t key, size_t first, size_t count, unsigned char* out) {
  switch (type) {
    case DataType::kInt8:
    case DataType::kUint8:
      return fill_bits<uint8_t>(key, first, count, out, [](uint64_t r) {
        const uint8_t value = static_cast<uint8_t>(1 + r % 254);
        return value == kPoison ? uint8_t(0x5A) : value;
      });
    case DataType::kInt32:
    case DataType::kUint32: return fill_bits<uint32_t>(key, first, count, out, integer_value<uint32_t>);
    case DataType::kInt64:
    case DataType::kUint64: return fill_bits<uint64_t>(key, first, count, out, integer_value<uint64_t>);
    case DataType::kFloat16: return fill_bits<uint16_t>(key, first, count, out, float_value<uint16_t, 10, 5, 10, 11>);
    case DataType::kBFloat16: return fill_bits<uint16_t>(key, first, count, out, float_value<uint16_t, 7, 8, 112, 31>);
    case DataType::kFloat32: return fill_bits<uint32_t>(key, first, count, out, float_value<uint32_t, 23, 8, 112, 31>);
    case DataType::kFloat64: return fill_bits<uint64_t>(key, first, count, out, float_value<uint64_t, 52, 11, 1008, 31>);
    case DataType::kFloat8E4M3: return fill_bits<uint8_t>(key, first, count, out, float_value<uint8_t, 3, 4, 5, 9>);
    case DataType::kFloat8E5M2: return fill_bits<uint8_t>(key, first, count, out, float_value<uint8_t, 2, 5, 10, 20>);
  }
  throw std::logic_error("fill_inputs: datatype outside the enum");
}

// ---- Checks ----

// `call` must throw braid::Error kInvalidArgument whose message contains one of `arguments` (e.g. "'send'").
inline void expect_invalid_argument(int rank, const std::string& what, const std::vector<const char*>& arguments,
                                    const std::function<void()>& call) {
  std::string names;
  for (const char* argument : arguments) names += (names.empty() ? "" : " or ") + std::string(argument);
  try {
    call();
    ADD_FAILURE() << "rank " << rank << ": " << what << " was accepted; expected kInvalidArgument naming " << names;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << "rank " << rank << ": " << what << ": " << error.what();
    const std::string message = error.what();
    const bool named = std::any_of(arguments.begin(), arguments.end(),
                                   [&](const char* argument) { return message.find(argument) != std::string::npos; });
    EXPECT_TRUE(named) << "rank " << rank << ": " << what << ": the message does not name " << names << ": " << message;
  }
}

// Whether BRAID_EAGER_ZERO_COPY=1 runs this process's eager calls (its own ctest entries): registered buffers of
// eager calls are then announced or staged, never exchanged.
inline bool eager_zero_copy_on() {
  const char* value = std::getenv("BRAID_EAGER_ZERO_COPY");
  return value != nullptr && std::string(value) == "1";
}

// Whether `text` names `value` as a number of its own.
inline bool names_number(const std::string& text, long long value) {
  return std::regex_search(text, std::regex("(^|[^0-9])" + std::to_string(value) + "([^0-9]|$)"));
}

// ---- CUDA graphs ----

struct GraphHandles {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GraphHandles() = default;
  GraphHandles(const GraphHandles&) = delete;
  GraphHandles& operator=(const GraphHandles&) = delete;
  ~GraphHandles() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

}  // namespace braid::testing

#include "collective_reference.hpp"
#include "world.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <cuda_fp8.h>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace braid::testing {
namespace {

// ---- Inputs ----

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The random bits of element `index` of the stream with key `key` (splitmix64 at position index + 1).
inline uint64_t random_at(uint64_t key, size_t index) {
  return mix64(key + (static_cast<uint64_t>(index) + 1) * kGolden);
}

// The stream of rank `rank`'s input for the case with seed `seed`.
uint64_t rank_key(uint64_t seed, int rank) { return mix64(seed ^ mix64(0xC011EC7ull + static_cast<uint64_t>(rank))); }

// Per-type facts. Integers: Bits (storage) and Value (how max/min compare). Floating types: Bits, and kQ:
// inputs are k * 2^-kQ with |k| <= 2^kQ, which needs kQ + 1 significant bits (half 11, bfloat16 8, float 24,
// double 53, fp8 e4m3 4, e5m2 3: exactly each type's precision) and never goes below 2^-kQ (normal in every
// type). kRtol: tolerance relative to the magnitude of the reduction; fp8's is per rounding (half an ulp,
// 2^-4 resp. 2^-3 of the result, and a margin for products) and counts world - 1 roundings, since NCCL's ring,
// braid's reduce chain and reduce-scatter's copy-engine pairs round after every step.
template <DataType T>
struct Traits;
template <> struct Traits<DataType::kInt8> { using Bits = uint8_t; using Value = int8_t; static constexpr bool kFloating = false; };
template <> struct Traits<DataType::kUint8> { using Bits = uint8_t; using Value = uint8_t; static constexpr bool kFloating = false; };
template <> struct Traits<DataType::kInt32> { using Bits = uint32_t; using Value = int32_t; static constexpr bool kFloating = false; };
template <> struct Traits<DataType::kUint32> { using Bits = uint32_t; using Value = uint32_t; static constexpr bool kFloating = false; };
template <> struct Traits<DataType::kInt64> { using Bits = uint64_t; using Value = int64_t; static constexpr bool kFloating = false; };
template <> struct Traits<DataType::kUint64> { using Bits = uint64_t; using Value = uint64_t; static constexpr bool kFloating = false; };
template <> struct Traits<DataType::kFloat16> { using Bits = uint16_t; static constexpr bool kFloating = true; static constexpr int kQ = 10; static constexpr double kRtol = 1e-2; };
template <> struct Traits<DataType::kBFloat16> { using Bits = uint16_t; static constexpr bool kFloating = true; static constexpr int kQ = 7; static constexpr double kRtol = 2e-2; };
template <> struct Traits<DataType::kFloat32> { using Bits = uint32_t; static constexpr bool kFloating = true; static constexpr int kQ = 23; static constexpr double kRtol = 1e-5; };
template <> struct Traits<DataType::kFloat64> { using Bits = uint64_t; static constexpr bool kFloating = true; static constexpr int kQ = 52; static constexpr double kRtol = 1e-12; };
template <> struct Traits<DataType::kFloat8E4M3> { using Bits = uint8_t; static constexpr bool kFloating = true; static constexpr int kQ = 3; static constexpr double kRtol = 0.07; };
template <> struct Traits<DataType::kFloat8E5M2> { using Bits = uint8_t; static constexpr bool kFloating = true; static constexpr int kQ = 2; static constexpr double kRtol = 0.145; };

template <DataType T>
constexpr bool kIsFp8 = T == DataType::kFloat8E4M3 || T == DataType::kFloat8E5M2;
template <DataType T>
constexpr __nv_fp8_interpretation_t kFp8Kind = T == DataType::kFloat8E4M3 ? __NV_E4M3 : __NV_E5M2;

template <DataType T>
using Tag = std::integral_constant<DataType, T>;

// Calls f(Tag<type>{}): the per-type code below is a template, so inner loops have no switch on the type.
template <typename F>
decltype(auto) dispatch(DataType type, F&& f) {
  switch (type) {
    case DataType::kInt8: return f(Tag<DataType::kInt8>{});
    case DataType::kUint8: return f(Tag<DataType::kUint8>{});
    case DataType::kInt32: return f(Tag<DataType::kInt32>{});
    case DataType::kUint32: return f(Tag<DataType::kUint32>{});
    case DataType::kInt64: return f(Tag<DataType::kInt64>{});
    case DataType::kUint64: return f(Tag<DataType::kUint64>{});
    case DataType::kFloat16: return f(Tag<DataType::kFloat16>{});
    case DataType::kBFloat16: return f(Tag<DataType::kBFloat16>{});
    case DataType::kFloat32: return f(Tag<DataType::kFloat32>{});
    case DataType::kFloat64: return f(Tag<DataType::kFloat64>{});
    case DataType::kFloat8E4M3: return f(Tag<DataType::kFloat8E4M3>{});
    case DataType::kFloat8E5M2: return f(Tag<DataType::kFloat8E5M2>{});
  }
  throw std::logic_error("collective reference: datatype outside the enum");
}

// A floating input from random bits r: k * 2^-q with k in [-2^q, 2^q]; for prod, magnitude in [0.5, 1.5]
// (k in [2^(q-1), 3 * 2^(q-1)]) and a random sign, so products of up to 8 ranks stay in [2^-8, 26].
template <DataType T>
double float_input(uint64_t r, bool prod) {
  constexpr uint64_t kOne = uint64_t(1) << Traits<T>::kQ;
  constexpr double kUnit = 1.0 / static_cast<double>(kOne);  // a power of two: exact
  if (prod) {
    const uint64_t magnitude = kOne / 2 + r % (kOne + 1);
    return ((r >> 63) != 0 ? -1.0 : 1.0) * static_cast<double>(magnitude) * kUnit;
  }
  const int64_t k = static_cast<int64_t>(r % (2 * kOne + 1)) - static_cast<int64_t>(kOne);
  return static_cast<double>(k) * kUnit;
}

[[noreturn]] void not_exact(double value) {
  char text[96];
  std::snprintf(text, sizeof text, "collective reference: %.17g is not exactly representable", value);
  throw std::logic_error(text);
}

template <DataType T>
double decode(typename Traits<T>::Bits bits);

// The bits of `value` in floating type T; value must be exactly representable (a normal number or zero).
template <DataType T>
typename Traits<T>::Bits encode(double value) {
  if constexpr (T == DataType::kFloat64) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
  } else if constexpr (kIsFp8<T>) {
    const uint8_t bits = __nv_cvt_double_to_fp8(value, __NV_SATFINITE, kFp8Kind<T>);
    if (decode<T>(bits) != value) not_exact(value);
    return bits;
  } else {
    const float f = static_cast<float>(value);
    if (static_cast<double>(f) != value) not_exact(value);
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if constexpr (T == DataType::kFloat32) {
      return u;
    } else if constexpr (T == DataType::kBFloat16) {
      if ((u & 0xFFFFu) != 0) not_exact(value);  // bfloat16 is the top half of a float
      return static_cast<uint16_t>(u >> 16);
    } else {
      static_assert(T == DataType::kFloat16);
      const uint32_t sign = (u >> 16) & 0x8000u;
      if ((u & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(sign);
      const int exponent = static_cast<int>((u >> 23) & 0xFFu) - 127 + 15;       // rebias 8-bit to 5-bit
      if (exponent < 1 || exponent > 30 || (u & 0x1FFFu) != 0) not_exact(value);  // 23-bit to 10-bit mantissa
      return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) | ((u >> 13) & 0x3FFu));
    }
  }
}

// The value of floating bits of type T, for any pattern.
template <DataType T>
double decode(typename Traits<T>::Bits bits) {
  if constexpr (T == DataType::kFloat64) {
    double value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  } else if constexpr (T == DataType::kFloat32) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  } else if constexpr (kIsFp8<T>) {
    const __half_raw half = __nv_cvt_fp8_to_halfraw(bits, kFp8Kind<T>);  // exact: fp8 values are halves
    return decode<DataType::kFloat16>(half.x);
  } else if constexpr (T == DataType::kBFloat16) {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &u, sizeof value);
    return value;
  } else {
    static_assert(T == DataType::kFloat16);
    const uint32_t exponent = (bits >> 10) & 0x1Fu;
    const uint32_t mantissa = bits & 0x3FFu;
    if (exponent == 0 || exponent == 31) {
      const double sign = (bits & 0x8000u) != 0 ? -1.0 : 1.0;
      if (exponent == 0) return sign * static_cast<double>(mantissa) * 0x1p-24;  // zero, subnormal: m/2^10 * 2^-14
      return mantissa != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
    }
    // Normal: (1 + m/2^10) * 2^(e-15), the same number as the float with exponent e - 15 and mantissa m << 13.
    const uint32_t u = (static_cast<uint32_t>(bits & 0x8000u) << 16) | ((exponent - 15 + 127) << 23) | (mantissa << 13);
    float value;
    std::memcpy(&value, &u, sizeof value);
    return value;
  }
}

// Bits of one input element from random bits r.
template <DataType T>
typename Traits<T>::Bits input_bits(uint64_t r, bool prod) {
  using Bits = typename Traits<T>::Bits;
  if constexpr (Traits<T>::kFloating) {
    return encode<T>(float_input<T>(r, prod));
  } else {
    return static_cast<Bits>(prod ? (r | 1) : r);  // odd factors: a product mod 2^w never vanishes
  }
}

// Integer reduction step in 64-bit unsigned arithmetic; the caller truncates to the type's width at the end,
// which gives the same bits as wrap-around arithmetic in the type's own width.
template <DataType T>
uint64_t combine_integer(ReduceOp op, uint64_t a, uint64_t b) {
  using Bits = typename Traits<T>::Bits;
  using Value = typename Traits<T>::Value;
  const Value va = static_cast<Value>(static_cast<Bits>(a));
  const Value vb = static_cast<Value>(static_cast<Bits>(b));
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;  // avg: the sum, divided at the end (finish_integer)
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMax: return va >= vb ? a : b;
    case ReduceOp::kMin: return va <= vb ? a : b;
  }
  throw std::logic_error("collective reference: unknown op");
}

// The last step of an integer reduction: avg divides the sum, wrapped to the type's width, by the world size,
// truncating toward zero (NCCL's ncclAvg on integers); the other ops keep it.
template <DataType T>
uint64_t finish_integer(ReduceOp op, uint64_t reduced, int world) {
  using Bits = typename Traits<T>::Bits;
  using Value = typename Traits<T>::Value;
  if (op != ReduceOp::kAvg) return reduced;
  const Value sum = static_cast<Value>(static_cast<Bits>(reduced));
  return static_cast<Bits>(static_cast<Value>(sum / static_cast<Value>(world)));
}

template <DataType T>
std::string format_bits(typename Traits<T>::Bits bits) {
  char text[80];
  const int hex_digits = static_cast<int>(2 * sizeof bits);
  const unsigned long long hex = bits;
  if constexpr (Traits<T>::kFloating) {
    std::snprintf(text, sizeof text, "%.9g (0x%0*llx)", decode<T>(bits), hex_digits, hex);
  } else if constexpr (std::is_signed_v<typename Traits<T>::Value>) {
    std::snprintf(text, sizeof text, "%lld (0x%0*llx)", static_cast<long long>(static_cast<typename Traits<T>::Value>(bits)),
                  hex_digits, hex);
  } else {
    std::snprintf(text, sizeof text, "%llu (0x%0*llx)", hex, hex_digits, hex);
  }
  return text;
}

// ---- Comparing one output segment with the reference ----

struct SegmentResult {
  size_t wrong = 0;        // elements
  size_t first_wrong = 0;  // index within the segment
  std::string expected;
  std::string got;
  // Floating sums, averages and products: the elements compared, and the sums of |got - reference| and of
  // |reference| over them (NOTE [errors of a reduction, summed]).
  size_t rounded = 0;
  double error_sum = 0;
  double reference_sum = 0;
};

// NOTE [errors of a reduction, summed]
// An element's tolerance is a worst case: world - 1 fp8 roundings of partial results as large as the sum of
// |inputs|. At 8 ranks e5m2's reaches that sum itself, so an output of zeros passes element by element. Rounding
// errors are small and of either sign, though: summed over kSummedErrorsFrom or more of a case's elements they stay
// below half the sum of |reference| (a fifth at most in 3,000 simulated cases of 64 elements of these inputs per
// type, world 3 to 8, reduced in chain and tree order, averaged, multiplied; the largest 8 ranks' e5m2 products),
// while an output of zeros makes them exactly that sum.
constexpr size_t kSummedErrorsFrom = 64;

// got[i] (i < count) must be, bit for bit, element first + i of rank `source`'s input.
template <DataType T>
SegmentResult compare_input(const Case& c, int source, size_t first, size_t count, const unsigned char* got) {
  using Bits = typename Traits<T>::Bits;
  const bool prod = is_reducing(c.collective) && c.op == ReduceOp::kProd;
  const uint64_t key = rank_key(c.seed, source);
  SegmentResult result;
  for (size_t i = 0; i < count; ++i) {
    Bits value;
    std::memcpy(&value, got + i * sizeof(Bits), sizeof(Bits));
    const Bits expected = input_bits<T>(random_at(key, first + i), prod);
    if (value == expected) continue;
    if (result.wrong++ == 0) {
      result.first_wrong = i;
      result.expected = format_bits<T>(expected) + " (rank " + std::to_string(source) + "'s input)";
      result.got = format_bits<T>(value);
    }
  }
  return result;
}

// got[i] (i < count) must be the reduction, over ranks 0..world-1, of element first + i of their inputs.
template <DataType T>
SegmentResult compare_reduced(const Case& c, int world, size_t first, size_t count, const unsigned char* got) {
  using Bits = typename Traits<T>::Bits;
  const bool prod = c.op == ReduceOp::kProd;
  std::vector<uint64_t> keys(world);
  for (int r = 0; r < world; ++r) keys[r] = rank_key(c.seed, r);
  SegmentResult result;
  for (size_t i = 0; i < count; ++i) {
    Bits value;
    std::memcpy(&value, got + i * sizeof(Bits), sizeof(Bits));
    const size_t index = first + i;
    if constexpr (Traits<T>::kFloating) {
      double reference = 0, magnitude = 0;
      for (int r = 0; r < world; ++r) {
        const double x = decode<T>(input_bits<T>(random_at(keys[r], index), prod));  // what rank r sent
        switch (c.op) {
          case ReduceOp::kSum:
          case ReduceOp::kAvg: reference += x; magnitude += std::fabs(x); break;
          case ReduceOp::kProd: reference = r == 0 ? x : reference * x; break;
          case ReduceOp::kMax: reference = r == 0 ? x : std::max(reference, x); break;
          case ReduceOp::kMin: reference = r == 0 ? x : std::min(reference, x); break;
        }
      }
      if (c.op == ReduceOp::kAvg) {
        reference /= world;
        magnitude /= world;
      }
      if (c.op == ReduceOp::kProd) magnitude = std::fabs(reference);
      // max and min pick one of the inputs: exact. Otherwise relative to the magnitude (never below 1e-3).
      const bool exact = c.op == ReduceOp::kMax || c.op == ReduceOp::kMin;
      const double roundings = kIsFp8<T> ? std::max(1, world - 1) : 1;
      const double tolerance = exact ? 0.0 : Traits<T>::kRtol * roundings * std::max(magnitude, 1e-3);
      const double got_value = decode<T>(value);
      if (!exact) {
        ++result.rounded;
        result.error_sum += std::fabs(got_value - reference);  // NaN stays NaN: the summed check fails too
        result.reference_sum += std::fabs(reference);
      }
      if (std::fabs(got_value - reference) <= tolerance) continue;  // false for NaN
      if (result.wrong++ == 0) {
        char text[96];
        std::snprintf(text, sizeof text, "%.9g (tolerance %.3g)", reference, tolerance);
        result.first_wrong = i;
        result.expected = text;
        result.got = format_bits<T>(value);
      }
    } else {
      uint64_t reference = 0;
      for (int r = 0; r < world; ++r) {
        const uint64_t x = input_bits<T>(random_at(keys[r], index), prod);
        reference = r == 0 ? x : combine_integer<T>(c.op, reference, x);
      }
      const Bits expected = static_cast<Bits>(finish_integer<T>(c.op, reference, world));
      if (value == expected) continue;
      if (result.wrong++ == 0) {
        result.first_wrong = i;
        result.expected = format_bits<T>(expected);
        result.got = format_bits<T>(value);
      }
    }
  }
  return result;
}

// A segment of a case's recv region that the call writes: elements [offset, offset + count) of the region
// (as its own rank's recv buffer sees it: recv_index + i), each the reduction of input element first + i
// (reduced) or rank `source`'s input element first + i.
struct Output {
  size_t offset;      // elements from the region's start
  size_t count;
  bool reduced;
  int source;         // input segments
  size_t first;       // input element of the segment's first element
  size_t recv_index;  // index in recv of the segment's first element
};

std::vector<Output> outputs_of(const Case& c, int rank, int world) {
  const size_t n = c.count;
  switch (c.collective) {
    case Collective::kAllReduce: return {{0, n, true, -1, 0, 0}};
    case Collective::kReduce:
      if (rank == c.root) return {{0, n, true, -1, 0, 0}};
      return {};
    case Collective::kReduceScatter: {
      const size_t block = static_cast<size_t>(rank) * n;  // this rank's block of every rank's send
      return {{c.in_place ? block : 0, n, true, -1, block, 0}};
    }
    case Collective::kAllGather: {
      std::vector<Output> slots;
      for (int source = 0; source < world; ++source) {
        const size_t slot = static_cast<size_t>(source) * n;
        slots.push_back({slot, n, false, source, 0, slot});
      }
      return slots;
    }
    case Collective::kBroadcast: return {{0, n, false, c.root, 0, 0}};
  }
  return {};
}

size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// The first byte in [begin, end) where a and b differ, and how many differ; end when none.
size_t count_differences(const unsigned char* a, const unsigned char* b, size_t begin, size_t end, size_t& differing) {
  size_t first = end;
  constexpr size_t kStep = 1 << 16;
  for (size_t at = begin; at < end; at += kStep) {
    const size_t length = std::min(kStep, end - at);
    if (std::memcmp(a + at, b + at, length) == 0) continue;
    for (size_t i = at; i < at + length; ++i) {
      if (a[i] == b[i]) continue;
      if (first == end) first = i;
      ++differing;
    }
  }
  return first;
}

}  // namespace

// ---- Names and rules ----

const char* collective_name(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduce: return "reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "all_gather";
    case Collective::kBroadcast: return "broadcast";
  }
  return "?";
}

bool is_reducing(Collective collective) {
  return collective == Collective::kAllReduce || collective == Collective::kReduce ||
         collective == Collective::kReduceScatter;
}

bool has_root(Collective collective) { return collective == Collective::kReduce || collective == Collective::kBroadcast; }


std::vector<ReduceOp> supported_ops(DataType type) {
  std::vector<ReduceOp> ops;
  for (ReduceOp op : kAllReduceOps) {
    if (reduction_supported(type, op)) ops.push_back(op);
  }
  return ops;
}

std::string describe(const Case& c) {
  char text[256];
  std::snprintf(text, sizeof text, "%s %s%s%s count=%zu%s%s %s %s seed=0x%016llx", collective_name(c.collective),
                datatype_name(c.type), is_reducing(c.collective) ? " " : "",
                is_reducing(c.collective) ? reduce_op_name(c.op) : "", c.count, has_root(c.collective) ? " root=" : "",
                has_root(c.collective) ? std::to_string(c.root).c_str() : "", c.in_place ? "in-place" : "out-of-place",
                c.aligned ? "aligned" : "unaligned", static_cast<unsigned long long>(c.seed));
  return text;
}

size_t send_elements(const Case& c, int world) {
  return c.collective == Collective::kReduceScatter ? static_cast<size_t>(world) * c.count : c.count;
}

size_t recv_elements(const Case& c, int world) {
  return c.collective == Collective::kAllGather ? static_cast<size_t>(world) * c.count : c.count;
}

uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {
std::optional<uint64_t> g_replayed_seed;  // replay_seed()
}  // namespace

void replay_seed(uint64_t seed) { g_replayed_seed = seed; }

uint64_t shared_seed(Communicator& comm) {
  std::string mine = "-";
  if (comm.rank() == 0) {
    std::random_device device;
    mine = std::to_string(g_replayed_seed ? *g_replayed_seed : (static_cast<uint64_t>(device()) << 32) ^ device());
  }
  return std::stoull(comm.host_allgather(mine).at(0));
}

std::vector<Case> random_cases(uint64_t seed, int world, size_t calls, size_t (*count)(DataType, uint64_t, uint64_t)) {
  std::vector<Case> cases(calls);
  uint64_t draw = 0;
  auto next = [&] { return random_at(seed, draw++); };
  for (size_t i = 0; i < calls; ++i) {
    Case& c = cases[i];
    c.collective = kAllCollectives[next() % std::size(kAllCollectives)];
    c.type = kAllDataTypes[next() % std::size(kAllDataTypes)];
    const std::vector<ReduceOp> ops = supported_ops(c.type);
    c.op = is_reducing(c.collective) ? ops[next() % ops.size()] : ReduceOp::kSum;
    c.root = static_cast<int>(next() % static_cast<uint64_t>(world));
    c.in_place = next() % 4 == 0;
    c.aligned = next() % 3 != 0;
    const uint64_t r1 = next(), r2 = next();
    c.count = count(c.type, r1, r2);
    c.seed = mix64(seed ^ (i + 1));
  }
  return cases;
}

void fill_input(const Case& c, int rank, size_t first, size_t count, void* out) {
  const bool prod = is_reducing(c.collective) && c.op == ReduceOp::kProd;
  const uint64_t key = rank_key(c.seed, rank);
  dispatch(c.type, [&](auto tag) {
    constexpr DataType T = decltype(tag)::value;
    using Bits = typename Traits<T>::Bits;
    auto* bytes = static_cast<unsigned char*>(out);
    for (size_t i = 0; i < count; ++i) {
      const Bits bits = input_bits<T>(random_at(key, first + i), prod);
      std::memcpy(bytes + i * sizeof(Bits), &bits, sizeof(Bits));
    }
  });
}

uint64_t encode_exact(DataType floating_type, double value) {
  return dispatch(floating_type, [&](auto tag) -> uint64_t {
    constexpr DataType T = decltype(tag)::value;
    if constexpr (Traits<T>::kFloating) {
      return encode<T>(value);
    } else {
      throw std::logic_error("encode_exact: not a floating type");
    }
  });
}

double decode_float(DataType floating_type, uint64_t bits) {
  return dispatch(floating_type, [&](auto tag) -> double {
    constexpr DataType T = decltype(tag)::value;
    if constexpr (Traits<T>::kFloating) {
      return decode<T>(static_cast<typename Traits<T>::Bits>(bits));
    } else {
      throw std::logic_error("decode_float: not a floating type");
    }
  });
}

uint64_t reduce_integer(DataType integer_type, ReduceOp op, const std::vector<uint64_t>& inputs) {
  return dispatch(integer_type, [&](auto tag) -> uint64_t {
    constexpr DataType T = decltype(tag)::value;
    if constexpr (Traits<T>::kFloating) {
      throw std::logic_error("reduce_integer: not an integer type");
    } else {
      uint64_t result = inputs.at(0);
      for (size_t i = 1; i < inputs.size(); ++i) result = combine_integer<T>(op, result, inputs[i]);
      return static_cast<typename Traits<T>::Bits>(finish_integer<T>(op, result, static_cast<int>(inputs.size())));
    }
  });
}

std::string format_element(DataType type, const void* element) {
  return dispatch(type, [&](auto tag) {
    constexpr DataType T = decltype(tag)::value;
    typename Traits<T>::Bits bits;
    std::memcpy(&bits, element, sizeof bits);
    return format_bits<T>(bits);
  });
}

// ---- Batch ----

Batch::Region Batch::place(size_t& cursor, size_t elements, const Case& c) {
  const size_t element = datatype_size(c.type);
  Region region;
  region.begin = cursor;
  region.data = cursor + kGuardBytes + (c.aligned ? 0 : element);
  region.bytes = elements * element;
  region.end = round_up(region.data + region.bytes + kGuardBytes, 256);
  cursor = region.end;
  return region;
}

bool Batch::add(const Case& c, size_t send_capacity, size_t recv_capacity) {
  Placed placed;
  placed.c = c;
  size_t send_cursor = send_used_, recv_cursor = recv_used_;
  if (c.in_place) {
    placed.recv = place(recv_cursor, std::max(send_elements(c, world_), recv_elements(c, world_)), c);
  } else {
    placed.has_send_region = true;
    placed.send = place(send_cursor, send_elements(c, world_), c);
    placed.recv = place(recv_cursor, recv_elements(c, world_), c);
  }
  if (send_cursor > send_capacity || recv_cursor > recv_capacity) return false;
  send_used_ = send_cursor;
  recv_used_ = recv_cursor;
  placed_.push_back(placed);
  return true;
}

void Batch::need(const Case& c, int world, size_t& send_bytes, size_t& recv_bytes) {
  Batch batch(0, world);
  batch.add(c, SIZE_MAX, SIZE_MAX);
  send_bytes = batch.send_used_;
  recv_bytes = batch.recv_used_;
}

const void* Batch::send_pointer(size_t i, void* send_base, void* recv_base) const {
  const Placed& p = placed_.at(i);
  if (!p.c.in_place) return static_cast<unsigned char*>(send_base) + p.send.data;
  unsigned char* region = static_cast<unsigned char*>(recv_base) + p.recv.data;
  // all_gather in place: send is this rank's slot of recv. Otherwise send is the region's start
  // (recv == send, or, for reduce_scatter, the whole send buffer).
  if (p.c.collective == Collective::kAllGather) return region + static_cast<size_t>(rank_) * p.c.count * datatype_size(p.c.type);
  return region;
}

void* Batch::recv_pointer(size_t i, void* send_base, void* recv_base) const {
  (void)send_base;
  const Placed& p = placed_.at(i);
  unsigned char* region = static_cast<unsigned char*>(recv_base) + p.recv.data;
  // reduce_scatter in place: recv is this rank's block of send.
  if (p.c.in_place && p.c.collective == Collective::kReduceScatter) {
    return region + static_cast<size_t>(rank_) * p.c.count * datatype_size(p.c.type);
  }
  return region;
}

void Batch::initial_images(std::vector<unsigned char>& send, std::vector<unsigned char>& recv) const {
  send.assign(send_used_, kPoison);
  recv.assign(recv_used_, kPoison);
  for (const Placed& p : placed_) {
    const Case& c = p.c;
    const size_t element = datatype_size(c.type);
    if (!p.c.in_place) {
      fill_input(c, rank_, 0, send_elements(c, world_), send.data() + p.send.data);
    } else if (c.collective == Collective::kAllGather) {
      fill_input(c, rank_, 0, c.count, recv.data() + p.recv.data + static_cast<size_t>(rank_) * c.count * element);
    } else {
      fill_input(c, rank_, 0, send_elements(c, world_), recv.data() + p.recv.data);
    }
  }
}

std::string Batch::check_case(size_t index, const std::vector<unsigned char>& initial_send,
                              const std::vector<unsigned char>& initial_recv, const unsigned char* send,
                              const unsigned char* recv) const {
  const Placed& p = placed_[index];
  const Case& c = p.c;
  const size_t element = datatype_size(c.type);

  // The outputs: each element against the reference.
  size_t wrong = 0;
  std::string first_wrong;
  SegmentResult summed;  // the reduced outputs' errors, summed (NOTE [errors of a reduction, summed])
  std::vector<std::pair<size_t, size_t>> written;  // byte ranges of the recv arena the call writes
  for (const Output& out : outputs_of(c, rank_, world_)) {
    const size_t begin = p.recv.data + out.offset * element;
    written.emplace_back(begin, begin + out.count * element);
    SegmentResult result = dispatch(c.type, [&](auto tag) {
      constexpr DataType T = decltype(tag)::value;
      return out.reduced ? compare_reduced<T>(c, world_, out.first, out.count, recv + begin)
                         : compare_input<T>(c, out.source, out.first, out.count, recv + begin);
    });
    summed.rounded += result.rounded;
    summed.error_sum += result.error_sum;
    summed.reference_sum += result.reference_sum;
    if (result.wrong == 0) continue;
    if (wrong == 0) {
      first_wrong = "recv[" + std::to_string(out.recv_index + result.first_wrong) + "]: expected " + result.expected +
                    ", got " + result.got;
    }
    wrong += result.wrong;
  }

  // Everything else in the case's regions, guards included, must be as it was before the call.
  size_t changed = 0;
  std::string first_changed;
  auto unchanged = [&](bool in_send_arena, size_t begin, size_t end) {
    const unsigned char* before = (in_send_arena ? initial_send : initial_recv).data();
    const unsigned char* after = in_send_arena ? send : recv;
    const size_t first = count_differences(before, after, begin, end, changed);
    if (first == end || !first_changed.empty()) return;
    first_changed = where(p, in_send_arena, first);
    const Region& region = in_send_arena ? p.send : p.recv;
    if (first >= region.data && first < region.data + region.bytes) {  // an element: show it before and after
      const size_t element_start = region.data + (first - region.data) / element * element;
      first_changed += ": was " + format_element(c.type, before + element_start) + ", now " +
                       format_element(c.type, after + element_start);
    } else {
      char bytes[48];
      std::snprintf(bytes, sizeof bytes, ": was 0x%02x, now 0x%02x", before[first], after[first]);
      first_changed += bytes;
    }
  };
  if (p.has_send_region) unchanged(true, p.send.begin, p.send.end);
  std::sort(written.begin(), written.end());
  size_t at = p.recv.begin;
  for (const auto& [begin, end] : written) {
    unchanged(false, at, begin);
    at = end;
  }
  unchanged(false, at, p.recv.end);

  // Written so that NaN fails.
  const bool errors_small = summed.rounded < kSummedErrorsFrom || summed.error_sum <= summed.reference_sum / 2;
  if (wrong == 0 && changed == 0 && errors_small) return "";
  std::string message = "case " + std::to_string(index) + " (" + describe(c) + "):";
  if (wrong != 0) message += " " + std::to_string(wrong) + " wrong output element(s), first " + first_wrong + ";";
  if (!errors_small) {
    char text[160];
    std::snprintf(text, sizeof text, " the %zu reduced elements' errors sum to %.6g, over half their references' "
                  "magnitude %.6g (zeros, or ranks missing?);", summed.rounded, summed.error_sum, summed.reference_sum);
    message += text;
  }
  if (changed != 0) {
    message += " " + std::to_string(changed) + " byte(s) the call must not write changed, first " + first_changed + ";";
  }
  return message;
}

std::vector<std::string> Batch::check(const std::vector<unsigned char>& initial_send,
                                      const std::vector<unsigned char>& initial_recv, const unsigned char* send,
                                      const unsigned char* recv, size_t max_lines, size_t* failed_cases) const {
  if (initial_send.size() != send_used_ || initial_recv.size() != recv_used_) {
    throw std::logic_error("Batch::check: initial images do not belong to this batch");
  }
  std::vector<std::string> lines;
  size_t failed = 0;
  for (size_t i = 0; i < placed_.size(); ++i) {
    std::string problem = check_case(i, initial_send, initial_recv, send, recv);
    if (problem.empty()) continue;
    ++failed;
    if (lines.size() < max_lines) lines.push_back("rank " + std::to_string(rank_) + ": " + problem);
  }
  if (failed_cases != nullptr) *failed_cases = failed;
  return lines;
}

std::string Batch::locate(bool in_send_arena, size_t byte_offset) const {
  for (size_t i = 0; i < placed_.size(); ++i) {
    const Placed& p = placed_[i];
    if (in_send_arena && !p.has_send_region) continue;
    const Region& region = in_send_arena ? p.send : p.recv;
    if (byte_offset < region.begin || byte_offset >= region.end) continue;
    return "case " + std::to_string(i) + " (" + describe(p.c) + "): " + where(p, in_send_arena, byte_offset);
  }
  return std::string(in_send_arena ? "send" : "recv") + " arena byte " + std::to_string(byte_offset) +
         " (outside every case)";
}

std::string Batch::where(const Placed& p, bool in_send_arena, size_t byte_offset) {
  const Region& region = in_send_arena ? p.send : p.recv;
  std::string name;
  if (in_send_arena) name = "send";
  else if (!p.c.in_place) name = "recv";
  else if (p.c.collective == Collective::kReduceScatter) name = "send (in place: recv = send + rank * count)";
  else if (p.c.collective == Collective::kAllGather) name = "recv (in place: send = recv + rank * count)";
  else name = "recv (in place: = send)";
  if (byte_offset < region.data) return "guard byte " + std::to_string(region.data - byte_offset) + " before " + name;
  if (byte_offset >= region.data + region.bytes) {
    return "guard byte " + std::to_string(byte_offset - (region.data + region.bytes) + 1) + " after " + name;
  }
  const size_t element = datatype_size(p.c.type);
  const size_t index = (byte_offset - region.data) / element;
  return name + "[" + std::to_string(index) + "]";
}

// ---- Launch ----

void launch(Communicator& comm, const Case& c, const void* send, void* recv, cudaStream_t stream) {
  switch (c.collective) {
    case Collective::kAllReduce: comm.all_reduce(send, recv, c.count, c.type, c.op, stream); return;
    case Collective::kReduce: comm.reduce(send, recv, c.count, c.type, c.op, c.root, stream); return;
    case Collective::kReduceScatter: comm.reduce_scatter(send, recv, c.count, c.type, c.op, stream); return;
    case Collective::kAllGather: comm.all_gather(send, recv, c.count, c.type, stream); return;
    case Collective::kBroadcast: comm.broadcast(send, recv, c.count, c.type, c.root, stream); return;
  }
  throw std::logic_error("launch: collective outside the enum");
}

// ---- CUDA helpers ----

void cuda_check(cudaError_t result, const std::string& what) {
  if (result != cudaSuccess) {
    throw std::runtime_error(what + ": " + cudaGetErrorName(result) + " (" + cudaGetErrorString(result) + ")");
  }
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  cuda_check(cudaMalloc(&pointer_, std::max<size_t>(bytes, 1)), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (pointer_ != nullptr) free_when_ranks_end(pointer_);  // NOTE [shared-GPU waits] (world.hpp)
}

StreamHandle::StreamHandle() { cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }

StreamHandle::~StreamHandle() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

namespace {

// `bytes` from `from_host` to `device`, or from `device` to `to_host` (the other one null), through page-locked
// staging on `stream`, which is synchronised before and after.
void copy_through_pinned(void* device, const void* from_host, void* to_host, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // NOTE [shared-GPU waits]
  const PinnedStaging staging;
  for (size_t offset = 0; offset < bytes; offset += PinnedStaging::kBytes) {
    const size_t piece = std::min(PinnedStaging::kBytes, bytes - offset);
    if (from_host != nullptr) {
      std::memcpy(staging.get(), static_cast<const unsigned char*>(from_host) + offset, piece);
      cuda_check(cudaMemcpyAsync(static_cast<unsigned char*>(device) + offset, staging.get(), piece,
                                 cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    } else {
      cuda_check(cudaMemcpyAsync(staging.get(), static_cast<const unsigned char*>(device) + offset, piece,
                                 cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    }
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (to_host != nullptr) std::memcpy(static_cast<unsigned char*>(to_host) + offset, staging.get(), piece);
  }
}

}  // namespace

void upload(const Arenas& arenas, const std::vector<unsigned char>& send, const std::vector<unsigned char>& recv,
            cudaStream_t stream) {
  if (send.size() > arenas.send_capacity || recv.size() > arenas.recv_capacity) {
    throw std::logic_error("upload: images larger than the arenas");
  }
  copy_through_pinned(arenas.send, send.data(), nullptr, send.size(), stream);
  copy_through_pinned(arenas.recv, recv.data(), nullptr, recv.size(), stream);
}

void download(const Arenas& arenas, std::vector<unsigned char>& send, std::vector<unsigned char>& recv,
              cudaStream_t stream) {
  copy_through_pinned(arenas.send, nullptr, send.data(), send.size(), stream);
  copy_through_pinned(arenas.recv, nullptr, recv.data(), recv.size(), stream);
}

void seed_cases(std::vector<Case>& cases, uint64_t seed) {
  for (size_t i = 0; i < cases.size(); ++i) cases[i].seed = mix64(seed + i);
}

void capacities(const std::vector<Case>& cases, int world, size_t& send_capacity, size_t& recv_capacity) {
  send_capacity = recv_capacity = 256;
  for (const Case& c : cases) {
    size_t send_bytes = 0, recv_bytes = 0;
    Batch::need(c, world, send_bytes, recv_bytes);
    send_capacity = std::max(send_capacity, send_bytes);
    recv_capacity = std::max(recv_capacity, recv_bytes);
  }
}

}  // namespace braid::testing

#include "reference.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace braid::bench {
namespace {

// splitmix64's output function: a counter through it is a good stream of random bits.
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
inline uint64_t mix(uint64_t z) {
  z += kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One key per (seed, rank); element i's bits are mix(key + i * golden): splitmix64's stream from `key`.
inline uint64_t rank_key(uint64_t seed, int rank) { return mix(seed ^ mix(static_cast<uint64_t>(rank) + 1)); }
inline uint64_t element_bits(uint64_t key, size_t index) { return mix(key + static_cast<uint64_t>(index) * kGolden); }

template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

// Host conversions for every element type, through double (exact for all of them).
template <typename T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<double>(__half2float(value));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<double>(__bfloat162float(value));
  } else if constexpr (kIsFp8<T>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

template <typename T>
T from_float(float value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(value);
  } else {
    return static_cast<T>(value);
  }
}

template <typename T>
constexpr bool kIsFloat =
    std::is_floating_point_v<T> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> || kIsFp8<T>;

// Significand bits of each float type (float64 inputs are made as float32 values).
template <typename T>
constexpr int kSignificandBits = 24;
template <>
constexpr int kSignificandBits<__half> = 11;
template <>
constexpr int kSignificandBits<__nv_bfloat16> = 8;
template <>
constexpr int kSignificandBits<__nv_fp8_e4m3> = 4;
template <>
constexpr int kSignificandBits<__nv_fp8_e5m2> = 3;

// Branch-free on the random bits (a random branch per element costs more than the rest of the check).
template <typename T>
T make_value(uint64_t bits, ReduceOp op) {
  const bool prod = op == ReduceOp::kProd;
  if constexpr (kIsFloat<T>) {
    // A fraction in [0.5, 1) with the type's significand bits: every value below is exact in T, so the
    // conversion never rounds and the reference folds exactly the inputs the GPU gets.
    constexpr int p = kSignificandBits<T>;
    const uint32_t mantissa = (1u << (p - 1)) | static_cast<uint32_t>((bits >> 40) & ((1u << (p - 1)) - 1));
    const float fraction = static_cast<float>(static_cast<int32_t>(mantissa)) * (1.0f / static_cast<float>(1u << p));
    if (prod) return from_float<T>(2.0f * fraction - 0.5f);  // [0.5, 1.5)
    static constexpr float kScale[4] = {1.0f, 0.5f, 0.25f, 0.125f};
    const float sign = 1.0f - 2.0f * static_cast<float>(static_cast<int32_t>(bits & 1));
    return from_float<T>(sign * fraction * kScale[(bits >> 8) & 3]);  // ±[1/16, 1)
  } else {
    const T magnitude = static_cast<T>(prod ? 1 + (bits & 1) : 1 + (bits & 7));
    if constexpr (std::is_signed_v<T>) {
      const T sign = static_cast<T>(1 - 2 * static_cast<int>((bits >> 8) & 1));
      return static_cast<T>(sign * magnitude);
    } else {
      return magnitude;
    }
  }
}

template <typename T>
std::string print(T value) {
  char text[48];
  if constexpr (kIsFloat<T>) {
    std::snprintf(text, sizeof(text), "%.9g", to_double(value));
  } else if constexpr (std::is_signed_v<T>) {
    std::snprintf(text, sizeof(text), "%lld", static_cast<long long>(value));
  } else {
    std::snprintf(text, sizeof(text), "%llu", static_cast<unsigned long long>(value));
  }
  return text;
}

// Integers: reduce in the unsigned type of the same width, where sums and products wrap by definition.
template <typename T>
T reduce_int(T a, T b, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // the sum; compare_reduction divides it at the end
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    case ReduceOp::kProd:
      // uint8_t operands promote to int; 255 * 255 still fits, and the cast back wraps.
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  throw std::invalid_argument("unknown reduction");
}

// Values [first, first + count) of one rank's input (its key), into `out`.
template <typename T>
void fill(uint64_t key, size_t first, size_t count, ReduceOp op, T* out) {
  for (size_t k = 0; k < count; ++k) out[k] = make_value<T>(element_bits(key, first + k), op);
}

// This rank's output against the reference, a block of elements at a time: every rank's inputs for the
// block are regenerated and folded in with the operator chosen once per block, not per element (the check of
// a 128 MiB all-reduce over 8 ranks folds a quarter billion inputs).
template <typename T>
class Reference {
 public:
  explicit Reference(const CheckSpec& spec) : check_(spec), keys_(spec.ranks) {
    for (int rank = 0; rank < spec.ranks; ++rank) keys_[rank] = rank_key(spec.data.seed, rank);
  }

  void compare(size_t first, size_t count, const T* got, Mismatch& result) {
    for (size_t done = 0; done < count; done += kBlock) {
      const size_t n = std::min(kBlock, count - done);
      if (check_.coll == Collective::kAllGather || check_.coll == Collective::kBroadcast ||
          check_.coll == Collective::kAllToAll || check_.coll == Collective::kSendRecv) {
        compare_copies(first + done, n, got + done, result);
      } else {
        compare_reduction(first + done, n, got + done, result);
      }
    }
  }

 private:
  static constexpr size_t kBlock = 4096;

  // Values are printed for the first wrong element only: a collective that wrote nothing makes every
  // element wrong, and printing each would cost more than the check.
  template <typename E>
  void record(size_t i, E expected, T value, Mismatch& result) const {
    if (result.wrong++ == 0) {
      result.first_index = i;
      result.expected = print(expected);
      result.got = print(value);
    }
  }

  // allgather: output element i is rank i / send_count's input element i % send_count; broadcast: the root's i;
  // alltoall (per-peer count c = shape.count): output element i is block q = i / c, which rank q sent from its
  // block for this rank: rank q's input element rank * c + i % c; sendrecv: the previous rank's element i.
  void compare_copies(size_t first, size_t n, const T* got, Mismatch& result) {
    const ReduceOp op = check_.data.op;
    int rank = check_.root;
    size_t index = first;
    size_t block = 0;  // elements after which the source rank changes (0: never)
    size_t base = 0;   // input element of the source's first element in this rank's block
    if (check_.coll == Collective::kAllGather) {
      block = check_.shape.send_count;
      rank = static_cast<int>(first / block);
      index = first % block;
    } else if (check_.coll == Collective::kSendRecv) {
      rank = (check_.rank + check_.ranks - 1) % check_.ranks;
    } else if (check_.coll == Collective::kAllToAll) {
      block = check_.shape.count;
      base = static_cast<size_t>(check_.rank) * block;
      rank = static_cast<int>(first / block);
      index = first % block;
    }
    for (size_t k = 0; k < n; ++k) {
      const T expected = make_value<T>(element_bits(keys_[rank], base + index), op);
      if (std::memcmp(&expected, &got[k], sizeof(T)) != 0) record(first + k, expected, got[k], result);
      if (++index == block) {
        index = 0;
        ++rank;
      }
    }
  }

  // allreduce, reduce: output element i reduces every rank's input element i; reducescatter: element
  // rank * recv_count + i.
  void compare_reduction(size_t first, size_t n, const T* got, Mismatch& result) {
    const ReduceOp op = check_.data.op;
    const size_t index = check_.coll == Collective::kReduceScatter
                             ? static_cast<size_t>(check_.rank) * check_.shape.recv_count + first
                             : first;
    fill(keys_[0], index, n, op, values_);
    if constexpr (kIsFloat<T>) {
      for (size_t k = 0; k < n; ++k) {
        sum_[k] = to_double(values_[k]);
        magnitude_[k] = std::fabs(sum_[k]);
      }
      for (int rank = 1; rank < check_.ranks; ++rank) {
        fill(keys_[rank], index, n, op, values_);
        switch (op) {
          case ReduceOp::kSum:
          case ReduceOp::kAvg:
            for (size_t k = 0; k < n; ++k) {
              const double x = to_double(values_[k]);
              sum_[k] += x;
              magnitude_[k] += std::fabs(x);
            }
            break;
          case ReduceOp::kProd:
            for (size_t k = 0; k < n; ++k) sum_[k] *= to_double(values_[k]);
            break;
          case ReduceOp::kMax:
            for (size_t k = 0; k < n; ++k) sum_[k] = std::max(sum_[k], to_double(values_[k]));
            break;
          case ReduceOp::kMin:
            for (size_t k = 0; k < n; ++k) sum_[k] = std::min(sum_[k], to_double(values_[k]));
            break;
        }
      }
      const double tol = (op == ReduceOp::kMax || op == ReduceOp::kMin) ? 0.0 : tolerance(check_.data.type, check_.ranks);
      const double ranks = check_.ranks;
      for (size_t k = 0; k < n; ++k) {
        double expected = sum_[k], magnitude = magnitude_[k];
        if (op == ReduceOp::kAvg) {
          expected /= ranks;
          magnitude /= ranks;
        }
        if (op == ReduceOp::kProd) magnitude = std::fabs(expected);
        // Written so that NaN (the poison) fails too.
        if (!(std::fabs(to_double(got[k]) - expected) <= tol * magnitude)) {
          record(first + k, expected, got[k], result);
        }
      }
    } else {
      for (size_t k = 0; k < n; ++k) reduced_[k] = values_[k];
      for (int rank = 1; rank < check_.ranks; ++rank) {
        fill(keys_[rank], index, n, op, values_);
        switch (op) {  // the operator outside the loop, so each loop vectorises
          case ReduceOp::kSum:
            for (size_t k = 0; k < n; ++k) reduced_[k] = reduce_int(reduced_[k], values_[k], ReduceOp::kSum);
            break;
          case ReduceOp::kProd:
            for (size_t k = 0; k < n; ++k) reduced_[k] = reduce_int(reduced_[k], values_[k], ReduceOp::kProd);
            break;
          case ReduceOp::kMax:
            for (size_t k = 0; k < n; ++k) reduced_[k] = std::max(reduced_[k], values_[k]);
            break;
          case ReduceOp::kMin:
            for (size_t k = 0; k < n; ++k) reduced_[k] = std::min(reduced_[k], values_[k]);
            break;
          case ReduceOp::kAvg:  // the wrapped sum, divided below
            for (size_t k = 0; k < n; ++k) reduced_[k] = reduce_int(reduced_[k], values_[k], ReduceOp::kSum);
            break;
        }
      }
      // avg on integers: the sum divided by the ranks, truncated toward zero (NCCL's ncclAvg).
      if (op == ReduceOp::kAvg) {
        for (size_t k = 0; k < n; ++k) reduced_[k] = static_cast<T>(reduced_[k] / static_cast<T>(check_.ranks));
      }
      for (size_t k = 0; k < n; ++k) {
        if (reduced_[k] != got[k]) record(first + k, reduced_[k], got[k], result);
      }
    }
  }

  const CheckSpec& check_;
  std::vector<uint64_t> keys_;
  T values_[kBlock];
  T reduced_[kBlock];
  double sum_[kBlock];
  double magnitude_[kBlock];
};

// Calls f(T{}) with the element type of `type`.
template <typename F>
void with_type(DataType type, F&& f) {
  switch (type) {
    case DataType::kInt8: return f(int8_t{});
    case DataType::kUint8: return f(uint8_t{});
    case DataType::kInt32: return f(int32_t{});
    case DataType::kUint32: return f(uint32_t{});
    case DataType::kInt64: return f(int64_t{});
    case DataType::kUint64: return f(uint64_t{});
    case DataType::kFloat16: return f(__half{});
    case DataType::kBFloat16: return f(__nv_bfloat16{});
    case DataType::kFloat32: return f(float{});
    case DataType::kFloat64: return f(double{});
    case DataType::kFloat8E4M3: return f(__nv_fp8_e4m3{});
    case DataType::kFloat8E5M2: return f(__nv_fp8_e5m2{});
  }
  throw std::invalid_argument("unknown datatype");
}

}  // namespace

void generate_input(const DataSpec& data, int rank, size_t first, size_t count, void* out) {
  const uint64_t key = rank_key(data.seed, rank);
  with_type(data.type, [&](auto zero) {
    using T = decltype(zero);
    T* values = static_cast<T*>(out);
    for (size_t k = 0; k < count; ++k) values[k] = make_value<T>(element_bits(key, first + k), data.op);
  });
}

unsigned char poison_byte(DataType type) { return is_signed_int(type) ? 0x7F : 0xFF; }

double tolerance(DataType type, int ranks) {
  const double n = std::max(ranks, 1);
  switch (type) {
    case DataType::kFloat32: return 1e-5 * n;
    // A reduction in the 16-bit type may round after each of the n - 1 steps (bf16: 2^-9 each) and once at
    // the end: 2e-2 covers that up to 8 ranks; beyond, grow with n.
    case DataType::kFloat16:
    case DataType::kBFloat16: return std::max(2e-2, n * (1.0 / 256));
    case DataType::kFloat64: return 1e-12;
    // fp8 rounds to 4 (e4m3) or 3 (e5m2) significant bits: half an ulp is 2^-4 resp. 2^-3 of the result, once
    // for braid (float32 accumulation), after each of the n - 1 steps of NCCL's ring.
    case DataType::kFloat8E4M3: return 0.07 * std::max(1.0, n - 1);
    case DataType::kFloat8E5M2: return 0.145 * std::max(1.0, n - 1);
    default: return 0.0;
  }
}

bool output_defined(const CheckSpec& check) {
  return check.coll != Collective::kReduce || check.rank == check.root;
}

void compare_output(const CheckSpec& check, size_t first, size_t count, const void* got, Mismatch& result) {
  if (has_op(check.coll) && !reduction_supported(check.data.type, check.data.op)) {
    throw std::invalid_argument(std::string("reference: ") + reduce_op_name(check.data.op) + " is not defined for " +
                                datatype_name(check.data.type));
  }
  with_type(check.data.type, [&](auto zero) {
    using T = decltype(zero);
    auto reference = std::make_unique<Reference<T>>(check);  // its blocks are too large for a thread's stack
    reference->compare(first, count, static_cast<const T*>(got), result);
  });
}

}  // namespace braid::bench

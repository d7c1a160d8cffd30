// Run-time (datatype, op) to kernel template instantiation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "braid/types.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/kernel_pairs.hpp"
#include "core/error.hpp"

namespace braid::kernels {

// A datatype as a C++ type and as braid's DataType.
template <typename T, DataType Type>
struct TypeTag {
  using type = T;
  static constexpr DataType value = Type;
};
template <ReduceOp Op> using OpTag = std::integral_constant<ReduceOp, Op>;

template <typename F>
void dispatch_type(DataType type, F&& body) {
  switch (type) {
    case DataType::kInt8: return body(TypeTag<int8_t, DataType::kInt8>{});
    case DataType::kUint8: return body(TypeTag<uint8_t, DataType::kUint8>{});
    case DataType::kInt32: return body(TypeTag<int32_t, DataType::kInt32>{});
    case DataType::kUint32: return body(TypeTag<uint32_t, DataType::kUint32>{});
    case DataType::kInt64: return body(TypeTag<int64_t, DataType::kInt64>{});
    case DataType::kUint64: return body(TypeTag<uint64_t, DataType::kUint64>{});
    case DataType::kFloat16: return body(TypeTag<__half, DataType::kFloat16>{});
    case DataType::kFloat32: return body(TypeTag<float, DataType::kFloat32>{});
    case DataType::kFloat64: return body(TypeTag<double, DataType::kFloat64>{});
    case DataType::kBFloat16: return body(TypeTag<__nv_bfloat16, DataType::kBFloat16>{});
    case DataType::kFloat8E4M3: return body(TypeTag<__nv_fp8_e4m3, DataType::kFloat8E4M3>{});
    case DataType::kFloat8E5M2: return body(TypeTag<__nv_fp8_e5m2, DataType::kFloat8E5M2>{});
  }
  raise(ErrorCode::kInternal, "datatype {} reached a kernel launcher", static_cast<int>(type));
}

template <typename F>
void dispatch_op(ReduceOp op, F&& body) {
  switch (op) {
    case ReduceOp::kSum: return body(OpTag<ReduceOp::kSum>{});
    case ReduceOp::kProd: return body(OpTag<ReduceOp::kProd>{});
    case ReduceOp::kMax: return body(OpTag<ReduceOp::kMax>{});
    case ReduceOp::kMin: return body(OpTag<ReduceOp::kMin>{});
    case ReduceOp::kAvg: return body(OpTag<ReduceOp::kAvg>{});
  }
  raise(ErrorCode::kInternal, "op {} reached a kernel launcher", static_cast<int>(op));
}

// Launches `kernel<T, Op>` for the run-time pair; only pairs kernel_pair_built admits are instantiated (the host
// refuses the others before any launch).
#define BRAID_LAUNCH_TYPED(kernel, type, op, blocks, stream, ...)                                              \
  ::braid::kernels::dispatch_type(type, [&](auto type_tag) {                                                  \
    ::braid::kernels::dispatch_op(op, [&](auto op_tag) {                                                      \
      using T = typename decltype(type_tag)::type;                                                            \
      if constexpr (::braid::kernels::kernel_pair_built(decltype(type_tag)::value, decltype(op_tag)::value)) { \
        ::braid::kernels::launch_dependent(kernel<T, decltype(op_tag)::value>, blocks, ::braid::kernels::kThreadsPerBlock, stream, __VA_ARGS__); \
      } else {                                                                                                \
        ::braid::raise(::braid::ErrorCode::kInternal, "{} of {} reached a kernel launcher",                   \
                       ::braid::reduce_op_name(op), ::braid::datatype_name(type));                            \
      }                                                                                                       \
    });                                                                                                       \
  })

}  // namespace braid::kernels

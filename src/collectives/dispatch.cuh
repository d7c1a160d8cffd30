// Turns a run-time (datatype, op) into a kernel template instantiation: one place for the type table.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "braid/types.hpp"
#include "core/error.hpp"

namespace braid::kernels {

template <typename T> struct TypeTag { using type = T; };
template <ReduceOp Op> using OpTag = std::integral_constant<ReduceOp, Op>;

template <typename F>
void dispatch_type(DataType type, F&& body) {
  switch (type) {
    case DataType::kInt8: return body(TypeTag<int8_t>{});
    case DataType::kUint8: return body(TypeTag<uint8_t>{});
    case DataType::kInt32: return body(TypeTag<int32_t>{});
    case DataType::kUint32: return body(TypeTag<uint32_t>{});
    case DataType::kInt64: return body(TypeTag<int64_t>{});
    case DataType::kUint64: return body(TypeTag<uint64_t>{});
    case DataType::kFloat16: return body(TypeTag<__half>{});
    case DataType::kFloat32: return body(TypeTag<float>{});
    case DataType::kFloat64: return body(TypeTag<double>{});
    case DataType::kBFloat16: return body(TypeTag<__nv_bfloat16>{});
    case DataType::kFloat8E4M3: return body(TypeTag<__nv_fp8_e4m3>{});
    case DataType::kFloat8E5M2: return body(TypeTag<__nv_fp8_e5m2>{});
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

// Instantiates `Kernel<T, Op>` for the run-time pair and launches it.
#define BRAID_LAUNCH_TYPED(kernel, type, op, blocks, stream, ...)                                         \
  ::braid::kernels::dispatch_type(type, [&](auto type_tag) {                                             \
    ::braid::kernels::dispatch_op(op, [&](auto op_tag) {                                                 \
      using T = typename decltype(type_tag)::type;                                                       \
      kernel<T, decltype(op_tag)::value><<<blocks, ::braid::kernels::kThreadsPerBlock, 0, stream>>>(__VA_ARGS__); \
    });                                                                                                  \
  })

}  // namespace braid::kernels

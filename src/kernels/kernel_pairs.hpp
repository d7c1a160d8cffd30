// The (datatype, op) pairs built: all, or those of -DBRAID_KERNEL_PAIRS. Calls refuse the others (kUnsupported).
#pragma once

#include "braid/types.hpp"
#include "braid_kernel_pairs.inc"

namespace braid::kernels {

constexpr bool kernel_pair_built(DataType type, ReduceOp op) {
  if (!reduction_supported(type, op)) return false;
#ifdef BRAID_EVERY_KERNEL_PAIR
  return true;
#else
#define BRAID_KERNEL_PAIR(pair_type, pair_op) \
  if (type == DataType::pair_type && op == ReduceOp::pair_op) return true;
  BRAID_KERNEL_PAIR_LIST
#undef BRAID_KERNEL_PAIR
  return false;
#endif
}

// BRAID_KERNEL_PAIRS as configured, for messages.
constexpr const char* kKernelPairsOption = BRAID_KERNEL_PAIRS_OPTION;

}  // namespace braid::kernels

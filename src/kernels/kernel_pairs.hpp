// The (datatype, op) pairs this build has reduction kernels for: every pair braid reduces, or, in a developer
// build configured with -DBRAID_KERNEL_PAIRS="float32:sum;...", those alone (src/CMakeLists.txt generates
// braid_kernel_pairs.inc from the option). Kernel launchers instantiate only these (dispatch.cuh); the call checks
// refuse the others with kUnsupported before anything is enqueued.
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

// BRAID_KERNEL_PAIRS as configured ("all" in a full build), for messages.
constexpr const char* kKernelPairsOption = BRAID_KERNEL_PAIRS_OPTION;

}  // namespace braid::kernels

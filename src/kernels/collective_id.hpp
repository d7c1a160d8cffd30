// Collective ids, as in device::ErrorWord::collective.
#pragma once

namespace braid {

enum class Collective : unsigned int {
  kAllReduce = 1,
  kReduce = 2,
  kReduceScatter = 3,
  kAllGather = 4,
  kBroadcast = 5,
  kAllToAll = 6,   // uniform blocks
  kAllToAllv = 7,  // per-peer counts
  kMoeDispatch = 8,  // 8-10: not in the selection table
  kMoeCombine = 9,
  kSendRecv = 10,
  kMatmulReduceScatter = 11,  // 11-12: FusedMatmul's exchanges in braid's Hopper GEMM; not in the table
  kAllGatherMatmul = 12,
};

}  // namespace braid

// The collectives by id: the kernels report the id of the call that failed (device::ErrorWord::collective), the
// host names it (collective_name, collectives/selection.hpp).
#pragma once

namespace braid {

enum class Collective : unsigned int {
  kAllReduce = 1,
  kReduce = 2,
  kReduceScatter = 3,
  kAllGather = 4,
  kBroadcast = 5,
  kAllToAll = 6,   // uniform blocks
  kAllToAllv = 7,  // per-peer counts (host or device arrays)
  kMoeDispatch = 8,  // not in the table (src/moe has its own kernels); ids for error reports
  kMoeCombine = 9,
  kSendRecv = 10,  // not in the table: runs all-to-all-v's pipelined kernel (its row) on the peers of a batch
};

}  // namespace braid

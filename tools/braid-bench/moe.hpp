// braid-bench --moe: MoE token dispatch and combine through braid::MoeBuffer, timed per phase and checked against a
// host reference, optionally beside the NCCL way frameworks do it today (--compare nccl).
//
// Workload, per value of --tokens T: every rank draws, from a seed every rank shares, K distinct experts of E per
// token (uniform) and a weight in (0, 1] per (token, k); token rows are a function of (seed, rank, element).
//   braid: MoeBuffer::dispatch(x, ids, weights, T), then MoeBuffer::combine(y = the dispatched rows, out, weighted).
//   NCCL:  dispatch = a routing kernel (per destination rank, the tokens that go there, each token once per rank),
//          ncclAlltoAll of the W int64 counts, the counts copied to the host with a stream synchronise (the host
//          round trip frameworks pay), a gather kernel packing rows per destination, and a grouped
//          ncclSend/ncclRecv alltoallv of the rows; combine = the reverse alltoallv of the same rows and a
//          weighted-sum kernel on the source rank.
// Each phase is timed alone (combine after the last dispatch), CUDA events on the rank's stream, median over
// repetitions, max over ranks. With -G, braid's dispatch and combine, and NCCL's combine, are captured in graphs of
// G calls and replayed; NCCL's dispatch cannot be (it synchronises with the host) and runs as launched.
#pragma once

#include <cstdint>
#include <memory>

#include "braid/braid.hpp"
#include "nccl.hpp"
#include "options.hpp"

namespace braid::bench {

// Runs the --moe benchmark on this rank (collective over comm's ranks); `nccl` is null unless NCCL is compared.
// Returns the wrong elements and entries summed over all ranks (0: every check passed, or nothing checked).
uint64_t moe_run(Communicator& comm, const Options& options, const std::shared_ptr<NcclLibrary>& nccl);

}  // namespace braid::bench

// Host side of the pipelined all-to-all that all_to_all.cpp and send_recv.cpp share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/all_to_all_launch.hpp"
#include "collectives/collective_context.hpp"
#include "collectives/planner.hpp"
#include "collectives/selection.hpp"

namespace braid::collectives {

// The launch of the pipelined all-to-all kernel on this communicator's FIFOs: `collective` names it in errors and
// timeouts; every peer is sent to and received from (send_peers = recv_peers = kEveryPeer), no size set yet. The
// caller sets sizes and offsets (and narrows the peers, send_recv). The one place the launch's defaults live.
kernels::AllToAllLaunch pipelined_launch(const CollectiveContext& state, Collective collective, const void* send,
                                         void* recv, size_t element_bytes);

// The plan word (collectives/plan.hpp) of an all-to-all or a send/recv batch: `count` elements of `type` a block
// (0 for all-to-all-v and send/recv, whose counts differ between ranks), zero copy where the kernels use the
// peers' buffers, which `send` and `recv` identify (0: none, or global memory).
uint64_t all_to_all_plan(Collective collective, Algorithm algorithm, int blocks, size_t count, DataType type,
                         bool zero_copy, uint64_t send = 0, uint64_t recv = 0);

// The plan of all-to-all-v (collective kAllToAllv) or a send/recv batch (kSendRecv): FIFO pushes at the table's
// width for that collective whatever the sizes (ranks moving different amounts launch alike), within the
// communicator's cap.
CallPlan pairwise_plan(const CollectiveContext& state, Collective collective, DataType type);

}  // namespace braid::collectives

// The CUDA backend's calls (backends/cuda): braid's own kernels over symmetric memory, for the GPUs of one host.
// Each takes a call its communicator has checked (collectives/call_checks.hpp) and enqueues it on `stream`; the
// caller holds the communicator's ordering scope. What a call runs is its plan (collectives/planner.hpp): the
// selection table's choice for the call and its buffers, the same on every rank that makes the same call.
#pragma once

#include <cstddef>

#include "collectives/call_checks.hpp"
#include "collectives/collective_context.hpp"
#include "kernels/ll_launch.hpp"
#include "collectives/planner.hpp"
#include "memory/peer_range.hpp"

namespace braid::collectives {

// What one launch can carry through this communicator's staging, LL and multicast areas (the planner's input).
AreaCapacities area_capacities(const CollectiveContext& context);
// The LL launch of `call` on this communicator's LL area, without its buffers, count and strides (all zero);
// `plan`: the call's plan word (the polls check the peers' barrier announcements against it).
kernels::LLLaunch ll_launch(const CollectiveContext& context, const CollectiveCall& call, uint64_t plan);

// All-reduce, reduce, reduce-scatter, all-gather, broadcast (collectives.cpp) and all-to-all (all_to_all.cpp).
void all_reduce(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void reduce(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void reduce_scatter(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void all_gather(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void broadcast(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void all_to_all(CollectiveContext& context, const CollectiveCall& call, Stream stream);

// The one-sided all-to-all from global memory: block `rank` of every rank's `send` (every rank's buffer as mapped
// here), `count` elements of `type`, into this rank's `recv`. `same_process_peers`: some peer's buffer is another
// GPU's cudaMalloc memory of this process, which SM loads read (copy engines elsewhere).
void all_to_all_global(CollectiveContext& context, const PeerBuffers& send, bool same_process_peers, void* recv,
                       size_t count, DataType type, Stream stream);

// All-to-all-v with host counts, and with device counts (all_to_all.cpp).
void all_to_allv(CollectiveContext& context, const AllToAllvCall& call, Stream stream);
void all_to_allv_device(CollectiveContext& context, const AllToAllvDeviceCall& call, Stream stream);

// A point-to-point batch (send_recv.cpp).
void send_recv(CollectiveContext& context, const PointToPointBatch& batch, Stream stream);

// Raises a failure an earlier kernel recorded (a timeout, a plan mismatch); check: that, then data a peer refused.
void raise_recorded_failure(CollectiveContext& context);
void check(CollectiveContext& context);

}  // namespace braid::collectives

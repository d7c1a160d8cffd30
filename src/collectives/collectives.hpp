// The CUDA backend's calls, braid's own kernels for the GPUs of one host: each enqueues a checked call's plan on
// `stream`, the caller holding the ordering scope.
#pragma once

#include <cstddef>

#include "collectives/call_checks.hpp"
#include "collectives/collective_context.hpp"
#include "kernels/ll_launch.hpp"
#include "kernels/staged_launch.hpp"
#include "collectives/planner.hpp"
#include "memory/peer_range.hpp"

namespace braid::collectives {

AreaCapacities area_capacities(const CollectiveContext& context);
// A staged launch over the call's buffers (count and strides zero) whose barriers announce `plan`.
kernels::StagedLaunch staged_call_launch(const CollectiveContext& context, const CollectiveCall& call, uint64_t plan);
// Buffers, count and strides zero; the polls check the peers' announcements against `plan`.
kernels::LLLaunch ll_launch(const CollectiveContext& context, const CollectiveCall& call, uint64_t plan);

void all_reduce(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void reduce(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void reduce_scatter(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void all_gather(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void broadcast(CollectiveContext& context, const CollectiveCall& call, Stream stream);
void all_to_all(CollectiveContext& context, const CollectiveCall& call, Stream stream);

// The one-sided all-to-all: block `rank` of every rank's `send` (as mapped here) into this rank's `recv`.
// `same_process_peers`: some buffer is another GPU's cudaMalloc memory of this process (SM loads; else engines).
void all_to_all_global(CollectiveContext& context, const PeerBuffers& send, bool same_process_peers, void* recv,
                       size_t count, DataType type, Stream stream);

void all_to_allv(CollectiveContext& context, const AllToAllvCall& call, Stream stream);
void all_to_allv_device(CollectiveContext& context, const AllToAllvDeviceCall& call, Stream stream);

void send_recv(CollectiveContext& context, const PointToPointBatch& batch, Stream stream);

// Raises a failure a kernel recorded (timeout, plan mismatch); check: that, then data a peer refused.
void raise_recorded_failure(CollectiveContext& context);
void check(CollectiveContext& context);

}  // namespace braid::collectives

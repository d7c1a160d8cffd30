// The launch functions of the protocol registry (protocols.hpp): each enqueues one row's kernels, copies or both
// for a planned call, with the call's GPU current and the ordering scope held. collectives.cpp defines those of
// all-reduce, reduce, reduce-scatter, all-gather and broadcast; all_to_all.cpp those of all-to-all.
#pragma once

#include <optional>

#include "collectives/call_checks.hpp"
#include "collectives/planner.hpp"
#include "memory/peer_range.hpp"

namespace braid::collectives {

struct CollectiveContext;

// A call, its plan, and the ranges of the buffers every peer maps (looked up only where the call may use them).
struct PlannedCall {
  const CollectiveCall& call;
  CallPlan plan;
  std::optional<PeerRange> send, recv;
};

// The plan's row's function; kInternal for a row launched by its pairs (protocols.hpp).
void launch(CollectiveContext& context, const PlannedCall& planned, Stream stream);

void run_all_reduce_ll(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_reduce_ll128(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_reduce_one_shot(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_reduce_two_shot(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_reduce_two_shot_zero_copy(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_reduce_announced(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_reduce_copy_engine(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_reduce_copy_engine_pairs(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_multicast(CollectiveContext& context, const PlannedCall& planned, Stream stream);  // all-reduce too

void run_reduce_ll(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_copy_engine_pairs(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_pipelined(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_two_shot(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_staged(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_split(CollectiveContext& context, const PlannedCall& planned, Stream stream);

void run_reduce_scatter_ll(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_scatter_staged(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_scatter_pipelined(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_scatter_zero_copy(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_scatter_announced(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_scatter_copy_engine(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_reduce_scatter_copy_engine_pairs(CollectiveContext& context, const PlannedCall& planned, Stream stream);

void run_all_gather_ll(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_gather_multicast(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_gather_staged(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_gather_pipelined(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_gather_zero_copy(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_gather_announced(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_gather_copy_engine(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_gather_copy_engine_pairs(CollectiveContext& context, const PlannedCall& planned, Stream stream);

void run_broadcast_ll(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_broadcast_staged(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_broadcast_split(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_broadcast_pipelined(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_broadcast_copy_engine(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_broadcast_copy_engine_pairs(CollectiveContext& context, const PlannedCall& planned, Stream stream);

void run_all_to_all_ll(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_to_all_pipelined(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_to_all_announced(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_to_all_direct(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_to_all_copy_engine(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_to_all_copy_engine_swap(CollectiveContext& context, const PlannedCall& planned, Stream stream);
void run_all_to_all_copy_engine_pairs(CollectiveContext& context, const PlannedCall& planned, Stream stream);

}  // namespace braid::collectives

// Host side of the pipelined all-to-all that all_to_all.cpp and send_recv.cpp share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/all_to_all_launch.hpp"
#include "collectives/collective_context.hpp"
#include "collectives/planner.hpp"
#include "collectives/selection.hpp"

namespace braid::collectives {

// The launch's defaults: every peer, no sizes; the caller sets sizes and offsets (and narrows the peers).
kernels::AllToAllLaunch pipelined_launch(const CollectiveContext& state, Collective collective, const void* send,
                                         void* recv, size_t element_bytes);

// The plan word of an all-to-all or send/recv batch: `count` a block (0 where counts differ between ranks);
// `send`, `recv`: identities of the peers' buffers the kernels use (0: none); `announced`: an announcing kernel;
// `in_place`: the engines' swap in place, whose schedule differs from the pushes out of place.
uint64_t all_to_all_plan(Collective collective, Algorithm algorithm, int blocks, size_t count, DataType type,
                         bool zero_copy, uint64_t send = 0, uint64_t recv = 0, bool announced = false,
                         bool in_place = false);

// All-to-all-v's or a send/recv batch's plan: FIFO pushes at the table's width whatever the sizes, so ranks
// moving different amounts launch alike.
CallPlan pairwise_plan(const CollectiveContext& state, Collective collective, DataType type);

}  // namespace braid::collectives

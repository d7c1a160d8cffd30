// Hooks for the GPU tests (tests/gpu), never for users: they put a MoeBuffer into states that no sequence of calls
// reaches. Internal header; the functions live in libbraid (moe_buffer.cpp), which the tests link whole.
#pragma once

#include "braid/moe.hpp"

namespace braid::testing {

// Makes the next dispatch of a rank-major buffer whose rows do not go in lines (moe_rank_major.cu) wait in vain
// for this rank's own blocks: block 0 waits until every block of the launch has counted itself in, and the count
// now starts far from 0, as if some block were never scheduled. The wait gives up after the communicator's timeout
// and records kTimeout naming this rank as the peer; the buffer and its communicator are unusable after it.
// Synchronous (the device is synchronised first); none of the buffer's work may be in flight. kInvalidArgument
// naming the buffer for any other layout.
void stall_next_moe_dispatch(MoeBuffer& buffer);

}  // namespace braid::testing

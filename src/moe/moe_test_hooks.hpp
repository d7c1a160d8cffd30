// Hooks for the GPU tests only: they put a MoeBuffer into states no sequence of calls reaches (moe_buffer.cpp).
#pragma once

#include "braid/moe.hpp"

namespace braid::testing {

// The next dispatch of a rank-major buffer not in lines waits in vain for its own blocks, as if one were never
// scheduled: kTimeout naming this rank, leaving buffer and communicator unusable. Synchronous; none of the
// buffer's work may be in flight. kInvalidArgument for other layouts.
void stall_next_moe_dispatch(MoeBuffer& buffer);

// The views every dispatch and redispatch of `buffer` returns (the handle apart: 0), known before the first one so
// that a test can poison them first.
MoeDispatchOutput moe_output_views(MoeBuffer& buffer);

}  // namespace braid::testing

// Fixed limits that host and device code share.
#pragma once

namespace braid {

// Ranks of one communicator. The kernels keep per-peer state in fixed arrays of this size, and launch
// arguments carry one pointer per rank by value: one host has at most 16 GPUs.
constexpr int kMaxWorld = 16;

}  // namespace braid

// LL kernel arguments (plain data, by value) and the LL area: [parity 2][sender world] slots a rank (ll.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/ll_device.hpp"
#include "braid/device/sync_device.hpp"
#include "core/limits.hpp"

namespace braid::kernels {

using device::kLLLineBytes;
using device::kLLWireBytes;
// Per launch and sender; 2-rank all-to-alls of 2 MiB fit (selection.cpp).
constexpr size_t kLLMaxPayloadBytes = size_t(1) << 20;

// Every this many LL calls each rank re-stamps its area's unwritten lines, so no flag (the sequence cut to 32
// bits) is older than a period (ll.cuh). Even, and far below 2^32.
constexpr uint64_t kLLRestampPeriod = uint64_t(1) << 30;

constexpr size_t kLLSlotBytes = (kLLMaxPayloadBytes / kLLLineBytes + 1) * kLLWireBytes;

constexpr size_t ll_area_bytes(int world) { return 2 * size_t(world) * kLLSlotBytes; }

struct LLLaunch {
  const char* send;
  char* recv;
  size_t count;  // elements (reductions) or bytes (blocks_ll) of one block
  // Bytes between receivers' send blocks (0: one for all) and between senders' recv blocks.
  size_t send_rank_stride;
  size_t recv_rank_stride;
  int root;  // reduce; -1: every rank stores
  unsigned int collective;
  char* area[kMaxWorld];
  size_t slot_bytes;
  size_t plan_line;    // byte offset in a slot (NOTE [plan lines])
  device::SignalPad pad;
  uint64_t plan;
  uint64_t* epoch;     // LL calls so far; sequence: epoch + 1, flag: its low 32 bits
  unsigned int* blocks_done;
};

}  // namespace braid::kernels

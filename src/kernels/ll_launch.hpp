// The arguments of the low-latency (LL) kernels (plain data, passed by value), and the layout of the
// LL area: every rank's symmetric LL buffer holds [parity 2][sender world] slots of slot_bytes, each line of 8
// payload bytes travelling as 16 bytes {data, flag, data, flag}; a slot's last line is the sender's plan line
// (ll.cuh, NOTE [plan lines]).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/ll_device.hpp"
#include "braid/device/sync_device.hpp"
#include "core/limits.hpp"

namespace braid::kernels {

using device::kLLLineBytes;  // payload of one line (braid/device/ll_device.hpp)
using device::kLLWireBytes;  // one line as stored: two 8-byte {4 data bytes, 4 flag bytes} halves
// Per launch and sender; larger calls run in chunks. All-to-all's LL block must fit whole: 1 MiB lets 2 ranks
// move 2 MiB all-to-alls by LL (selection.cpp).
constexpr size_t kLLMaxPayloadBytes = size_t(1) << 20;

// Every this many LL calls each rank re-stamps the lines of its LL area that a call leaves alone, so that no
// line's flag is older than about one period (a flag is the 64-bit sequence cut to 32 bits; ll.cuh,
// restamp_unwritten_lines). Any even value far below 2^32 works; calls whose sequence is 0 or 1 modulo it
// re-stamp (one call of each parity).
constexpr uint64_t kLLRestampPeriod = uint64_t(1) << 30;

// Bytes of one slot: kLLMaxPayloadBytes of lines, then the plan line.
constexpr size_t kLLSlotBytes = (kLLMaxPayloadBytes / kLLLineBytes + 1) * kLLWireBytes;

// Bytes of each rank's LL area for `world` ranks.
constexpr size_t ll_area_bytes(int world) { return 2 * size_t(world) * kLLSlotBytes; }

struct LLLaunch {
  const char* send;
  char* recv;
  size_t count;  // elements (reductions) or bytes (blocks_ll) of one block
  // Bytes between the send blocks of successive receivers (0: every receiver gets the same block: all-reduce,
  // all-gather), and between successive senders' blocks in recv (all-to-all, all-gather).
  size_t send_rank_stride;
  size_t recv_rank_stride;
  int root;  // reductions: the one rank that stores the result (reduce), or -1: every rank (all-reduce, reduce-scatter)
  unsigned int collective;
  char* area[kMaxWorld];  // every rank's LL area (collectives/peer_bases.hpp)
  size_t slot_bytes;   // bytes of one (parity, sender) slot
  size_t plan_line;    // where in a slot the sender's plan line lies (bytes; past the lines a call sends)
  device::SignalPad pad;
  uint64_t plan;       // the call's plan word: polls check the peers' barrier announcements against it (PlanCheck)
  uint64_t* epoch;     // LL calls so far (device memory); this call's sequence is epoch + 1 (flag: its low 32 bits)
  unsigned int* blocks_done;
};

}  // namespace braid::kernels

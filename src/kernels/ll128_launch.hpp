// The layout of the LL128 area (all_reduce_ll128.cu): every rank's symmetric LL128 buffer holds
// [parity 2][sender world] slots of kLL128SlotBytes. A slot is a run of 128-byte lines, each carrying 120 payload
// bytes and, in its last 8 bytes, the call's 64-bit sequence as its flag, then the sender's plan line (an LL
// line, ll.cuh NOTE [plan lines]) in a 128-byte line of its own. LL128 launches take LLLaunch (ll_launch.hpp)
// with this area, its slot size, the plan line's place and the LL128 call counter.
#pragma once

#include <cstddef>

namespace braid::kernels {

constexpr size_t kLL128LineBytes = 128;     // one line as stored
constexpr size_t kLL128LinePayload = 120;   // its payload; the last 8 bytes are the flag
constexpr size_t kLL128LinesPerWarp = 4;    // a warp stores 16 bytes a lane: 4 lines in one instruction
constexpr size_t kLL128WarpWire = kLL128LinesPerWarp * kLL128LineBytes;        // 512
constexpr size_t kLL128WarpPayload = kLL128LinesPerWarp * kLL128LinePayload;  // 480

// Payload per launch and sender; larger calls run in chunks, each launch its own sequence.
constexpr size_t kLL128MaxPayloadBytes = size_t(1) << 20;
constexpr size_t kLL128PlanLine = (kLL128MaxPayloadBytes + kLL128WarpPayload - 1) / kLL128WarpPayload * kLL128WarpWire;
constexpr size_t kLL128SlotBytes = kLL128PlanLine + kLL128LineBytes;

// Bytes of each rank's LL128 area for `world` ranks.
constexpr size_t ll128_area_bytes(int world) { return 2 * static_cast<size_t>(world) * kLL128SlotBytes; }

}  // namespace braid::kernels

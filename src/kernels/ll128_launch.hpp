// LL128 area layout (all_reduce_ll128.cu): [parity 2][sender world] slots a rank, each of 128-byte lines (120
// payload bytes and a 64-bit flag), then the sender's plan line (ll.cuh NOTE [plan lines]) in a line of its own.
#pragma once

#include <cstddef>

namespace braid::kernels {

constexpr size_t kLL128LineBytes = 128;
constexpr size_t kLL128LinePayload = 120;
constexpr size_t kLL128LinesPerWarp = 4;
constexpr size_t kLL128WarpWire = kLL128LinesPerWarp * kLL128LineBytes;
constexpr size_t kLL128WarpPayload = kLL128LinesPerWarp * kLL128LinePayload;

// Per launch and sender; larger calls run in chunks.
constexpr size_t kLL128MaxPayloadBytes = size_t(1) << 20;
constexpr size_t kLL128PlanLine = (kLL128MaxPayloadBytes + kLL128WarpPayload - 1) / kLL128WarpPayload * kLL128WarpWire;
constexpr size_t kLL128SlotBytes = kLL128PlanLine + kLL128LineBytes;

constexpr size_t ll128_area_bytes(int world) { return 2 * static_cast<size_t>(world) * kLL128SlotBytes; }

}  // namespace braid::kernels

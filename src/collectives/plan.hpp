// What one rank's kernels will do for a call, as one 64-bit word the ranks compare at its first barrier: ranks
// that planned or passed anything else fail with kMismatch before they touch each other's data.
// Bits 60-63: the algorithm + 1 (15: an exchange's barrier); 56-59 the collective; 55 zero copy; 48-54 the blocks;
// 0-47 a hash of the arguments and of the identity of every buffer the peers map (alike on every rank).
#pragma once

#include <cstdint>
#include <string>

#include "collectives/selection.hpp"

namespace braid::collectives {

struct PlanArguments {
  Collective collective;
  Algorithm algorithm;
  bool zero_copy;
  int blocks;
  uint64_t count;       // as the call counts
  uint64_t type;        // DataType
  uint64_t op;          // ReduceOp, or 0
  int64_t root;         // or -1
  uint64_t send_identity;  // PeerRange::identity of a buffer the peers map, else 0
  uint64_t recv_identity;
  bool announced = false;  // an announcing kernel (BufferMode::kAnnounced): part of the hash
  bool in_place = false;   // where the schedule depends on the placement (all-reduce by the copy engines)
};

uint64_t plan_word(const PlanArguments& plan);

enum class ExchangedBuffer { kSend = 1, kRecv = 2 };
// A registered buffer's first use at an address, or an automatic registration in a capture.
enum class ExchangeKind { kRegistered = 0, kAutomatic = 1 };

// The plan of the barrier before an exchange of a buffer's mappings (call_buffers.hpp).
uint64_t exchange_plan_word(Collective collective, ExchangedBuffer buffer, uint64_t bytes,
                            ExchangeKind kind = ExchangeKind::kRegistered);

// A word in words: "all_reduce twoshot zero copy with 32 blocks (arguments and buffers 0x...)".
std::string describe_plan(uint64_t word);

}  // namespace braid::collectives
